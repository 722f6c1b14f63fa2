# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The versions table (scripts/tpfix/audit/support_matrix.py) and the facts behind it.

Fast: README.md's table is the command's output; the FlashInfer re-pin of
each pin file is the one its series makes.  Slow: every fact of the pins
(Requires-Python, torch==, flashinfer-python==, the image's Python) equals
the official release's files, read here without tpfix.audit.support_matrix, and the
built wheels require the FlashInfer the table names.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tpfix.audit.support_matrix import README, _braced, pin_facts, python_range, readme_block, table
from tpfix.core.lines import Line, get_line, line_names, load_pins
from tpfix.core.patch_format import read_series, split
from tpfix.core.util import ROOT, Fail

LINES = line_names()


def test_readme_table_is_the_commands_output():
    proc = subprocess.run(
        [sys.executable, "-m", "tpfix.audit.support_matrix"],
        text=True,
        capture_output=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == table()
    assert readme_block(README.read_text()) == proc.stdout, (
        "README.md's versions table is stale: run "
        "build/venv/bin/python -m tpfix.audit.support_matrix --readme"
    )
    rows = proc.stdout.splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == LINES  # one row a line, default first
    for row, name in zip(rows, LINES, strict=True):  # a line's re-pin of FlashInfer is shown
        data = pin_facts(get_line(name))
        if "flashinfer-repinned" in data:
            repin = f"| {data['flashinfer-repinned']} (re-pinned from {data['flashinfer']}) |"
            assert repin in row, row


def _series_pins(line: Line, sign: str) -> list[str]:
    """flashinfer-python==X that the line's patches add (+) or remove (-)."""
    found = []
    for name in read_series(line.series):
        _, diff = split((line.patches / name).read_text())
        found += re.findall(rf"^\{sign}flashinfer-python==(\S+)", diff, re.M)
    return found


@pytest.mark.parametrize("name", LINES)
def test_the_repin_is_the_one_the_series_makes(name):
    line = get_line(name)
    data = pin_facts(line)
    added = _series_pins(line, "+")
    if "flashinfer-repinned" in data:
        assert added == [data["flashinfer-repinned"]]
        assert _series_pins(line, "-") == [data["flashinfer"]]
    else:
        assert added == []


def test_a_pin_file_without_the_facts_is_an_error(tmp_path):
    line = get_line()
    pins = tmp_path / "pins.toml"
    text = line.pins.read_text()
    pins.write_text(re.sub(r'^torch = ".*"\n', "", text, flags=re.M))
    with pytest.raises(Fail, match=r'no `torch = "..."`'):
        pin_facts(Line(line.version_file, pins, line.patches))


def test_formats():
    assert python_range("<3.15,>=3.10") == "3.10–3.14"
    assert python_range(">=3.11") == ">=3.11"
    assert _braced(["d/a-x86_64.whl", "d/a-aarch64.whl"]) == "d/a-{x86_64,aarch64}.whl"
    assert _braced(["a.whl"]) == "a.whl"


def _requires(wheel: Path) -> tuple[str, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(z.read(name).decode(), headersonly=True)
    return meta["Requires-Python"], meta.get_all("Requires-Dist")


def _pinned(requires: list[str], project: str) -> list[str]:
    return [m.group(1) for r in requires if (m := re.fullmatch(rf"{project}==(\S+)", r))]


@pytest.mark.slow
@pytest.mark.parametrize("name", LINES)
def test_pins_facts_are_the_official_releases(name):
    """Downloads the wheels the cache lacks (both architectures)."""
    from tpfix.stages.fetch import fetch, fetch_sdist

    line = get_line(name)
    data = tomllib.loads(line.pins.read_text())
    wheels = [a for a in load_pins(line.pins) if a.role == "wheel"]
    assert sorted(a.arch for a in wheels) == ["aarch64", "x86_64"]
    for art in wheels:
        requires_python, requires = _requires(fetch(art, line.pins))
        assert data["requires-python"] == requires_python, art.filename
        assert [data["torch"]] == _pinned(requires, "torch"), art.filename
        assert [data["flashinfer"]] == _pinned(requires, "flashinfer-python"), art.filename
    with tarfile.open(fetch_sdist(line.tag)) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("/docker/Dockerfile")]
        dockerfile = tar.extractfile(member).read().decode()
    assert f"\nARG PYTHON_VERSION={data['image-python']}\n" in dockerfile


@pytest.mark.slow
def test_the_built_wheel_requires_its_tables_flashinfer(built_wheel):
    data = tomllib.loads(get_line().pins.read_text())
    requires_python, requires = _requires(built_wheel)
    shipped = data.get("flashinfer-repinned", data["flashinfer"])
    assert _pinned(requires, "flashinfer-python") == [shipped]
    assert _pinned(requires, "torch") == [data["torch"]]
    assert requires_python == data["requires-python"]


@pytest.mark.slow
def test_every_other_built_line_requires_its_tables_flashinfer(line_build):
    line, wheel = line_build
    data = tomllib.loads(line.pins.read_text())
    requires_python, requires = _requires(wheel)
    shipped = data.get("flashinfer-repinned", data["flashinfer"])
    assert _pinned(requires, "flashinfer-python") == [shipped]
    assert _pinned(requires, "torch") == [data["torch"]]
    assert requires_python == data["requires-python"]
