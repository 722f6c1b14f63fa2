# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Each line's built wheel installs from the package index: `pip install
--dry-run` of the wheel file resolves all its requirements there, for the
line's official image (its CPython, the glibc of its Ubuntu), with the
FlashInfer the line ships (the re-pin, where its series re-pins it).  Where
upstream's pin is one the index does not serve (v0.34.0's
flashinfer-python==0.7.3), upstream's own wheel fails the same resolution
and names it: what the re-pin fixes."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tpfix.audit.resolution import target, target_platforms
from tpfix.core.lines import Line, get_line
from tpfix.stages.fetch import fetch_wheel

pytestmark = pytest.mark.slow  # a real build, and a resolution against the index


def dry_run(wheel: Path, line: Line, tmp: Path) -> subprocess.CompletedProcess:
    """The resolution of `wheel`'s requirements from the configured index,
    for the line's official image (resolution.target); nothing is installed."""
    tmp.mkdir(parents=True, exist_ok=True)
    tgt = target(line, "x86_64")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    cmd += ["--disable-pip-version-check", "--report", str(tmp / "report.json")]
    cmd += ["--python-version", tgt["python"], "--only-binary", ":all:"]
    for plat in target_platforms(tgt["platform"]):  # and the older manylinux tags
        cmd += ["--platform", plat]
    cmd += ["--target", str(tmp / "target"), str(wheel)]
    return subprocess.run(cmd, text=True, capture_output=True, timeout=900)


def _check(line: Line, wheel: Path, tmp_path: Path) -> None:
    facts = tomllib.loads(line.pins.read_text())
    upstream, ours = facts["flashinfer"], facts.get("flashinfer-repinned", facts["flashinfer"])
    proc = dry_run(wheel, line, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    got = {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}
    assert got["vllm"] == line.version
    assert got["flashinfer-python"] == ours
    started = line.patches / "rebase.json"  # start_line --repin: the index lacks upstream's pin
    repins = json.loads(started.read_text()).get("repins", {}) if started.exists() else {}
    if repins.get("flashinfer-python") == ours != upstream:  # upstream's wheel does not resolve
        theirs = dry_run(fetch_wheel("x86_64", line.tag), line, tmp_path / "official")
        assert theirs.returncode != 0
        assert f"No matching distribution found for flashinfer-python=={upstream}" in theirs.stderr


def test_the_default_lines_wheel_installs_from_the_index(built_wheel, tmp_path):
    _check(get_line(), built_wheel, tmp_path)


def test_each_other_lines_wheel_installs_from_the_index(line_build, tmp_path):
    line, wheel = line_build
    _check(line, wheel, tmp_path)
