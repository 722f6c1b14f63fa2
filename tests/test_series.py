# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The quilt series: exact application, canonical form, headers, lint, version."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tpfix.common import LABEL, PATCHES, read_series, read_version, sdist_pin
from tpfix.maint.series import check
from tpfix.replay.harness import tree_after
from tpfix.verify import touched_files

SERIES = read_series()


def test_series_is_not_empty_and_every_patch_is_listed():
    assert SERIES
    on_disk = sorted(p.name for p in PATCHES.glob("*.patch"))
    assert on_disk == sorted(SERIES), "a patch file is not in series, or vice versa"


def test_series_applies_exactly_and_refresh_reproduces_each_patch():
    check()  # raises Fail naming the patch otherwise


@pytest.mark.parametrize("name", SERIES)
def test_patch_header_is_complete(name: str):
    text = (PATCHES / name).read_text()
    header, sep, _ = text.partition("\n---\n")
    assert sep, f"{name}: no '---' line between header and diff"
    assert re.search(r"^From: .+ <.+@.+>$", header, re.M), "From: line"
    assert re.search(r"^Subject: \[PATCH\] \S.{10,}", header, re.M), "Subject: line"
    assert re.search(r"^Signed-off-by: .+ <.+@.+>$", header, re.M), "Signed-off-by"
    assert re.search(r"^Forwarded: \S+", header, re.M), "Forwarded: status"
    assert re.search(r"^(Fixes|Upstream): .*(#\d+|github\.com/)", header, re.M), (
        "upstream issue/PR reference"
    )
    body = header.split("\n\n", 1)[1]
    why = [line for line in body.splitlines() if line and not re.match(r"^\w[\w-]*: ", line)]
    assert len(why) >= 5, f"{name}: explain why in the body"
    assert re.search(r"^Subject: .*\n(?: .*\n)*\n", header + "\n", re.M)


def test_version_names_distribution_and_patch_level():
    version = read_version()
    public, local = version.split("+")
    assert public == sdist_pin().version
    label, level = local.split(".")
    assert label == LABEL
    assert int(level) == len(SERIES), "bump VERSION's patch level with the series"


def test_patched_python_is_ruff_clean_with_vllms_config():
    tree = tree_after(SERIES[-1])
    files = sorted(f for f in touched_files() if f.endswith(".py"))
    assert files, "the series touches no Python file"
    for args in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *args, *files],
            cwd=tree,
            text=True,
            capture_output=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
