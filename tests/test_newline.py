# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The next release, prepared: python -m tpfix.maint.newline TAG.

The v0.33.0 line is made again from the v0.27.1 line, in a copy of this
repository without patches/v0.33.0/, as a maintainer would on the day of a
release: its pins must equal the committed ones (same files, sha256, size,
CUDA, the versions table's facts) and its classification the committed
patches/v0.33.0/rebase.json.  The downloads are real (pip); the scenario checks
are the real replays.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tpfix.common import ROOT, Line, get_line, load_pins
from tpfix.maint.revision import problems
from tpfix.patchfile import read_series
from tpfix.versions import WHEEL_FACTS

# downloads the sdist and both official wheels of v0.33.0, replays scenarios
pytestmark = pytest.mark.slow

TAG = "v0.33.0"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    copy = tmp_path_factory.mktemp("newline") / "repo"
    for part in ("scripts", "pins", "patches"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "VERSION", copy / "VERSION")
    shutil.rmtree(copy / "patches" / TAG)
    # as on the day of a release: the FlashInfer the new tag pins has no pin yet
    fi = copy / "pins" / "flashinfer.toml"
    text = fi.read_text()
    start = text.index('[[artifact]]\nproject = "flashinfer-python"\nversion = "0.7.2.post1"')
    fi.write_text(text[:start])
    assert "0.7.2.post1" not in fi.read_text()
    proc = _newline(copy, TAG, "--from", "v0.27.1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return copy, proc


def _newline(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(copy / "scripts"))
    return subprocess.run(
        [sys.executable, "-m", "tpfix.maint.newline", *args],
        cwd=copy,
        env=env,
        text=True,
        capture_output=True,
        timeout=1800,
    )


def test_pins_equal_the_committed_ones(made):
    copy, _ = made
    committed = load_pins(get_line(TAG).pins)
    ours = load_pins(copy / "patches" / TAG / "pins.toml")
    assert sorted((a for a in ours if a.role != "test"), key=str) == sorted(committed, key=str)
    # the FlashInfer the scenario checks import, pinned from the downloaded file
    fi = [a for a in load_pins(ROOT / "pins" / "flashinfer.toml") if a.version == "0.7.2.post1"]
    assert [a for a in ours if a.role == "test"] == fi
    text = (copy / "patches" / TAG / "pins.toml").read_text()
    assert tomllib.loads(text)["cuda"] == get_line(TAG).official_cuda()
    # the versions table's facts, from the downloaded wheels and sdist
    ours, theirs = tomllib.loads(text), tomllib.loads(get_line(TAG).pins.read_text())
    for key in (*WHEEL_FACTS, "image-python"):
        assert ours[key] == theirs[key], key
    assert "flashinfer-repinned" not in ours  # a re-pin is the series', added by hand


def test_classification_equals_the_committed_one(made):
    copy, proc = made
    folder = copy / "patches" / TAG
    ours = json.loads((folder / "rebase.json").read_text())
    committed = json.loads((get_line(TAG).patches / "rebase.json").read_text())
    assert ours == committed
    carried = [n for n, s in ours["patches"].items() if s in ("applies", "applies-with-changes")]
    assert (folder / "series").read_text().split() == carried
    assert (folder / "VERSION").read_text() == f"{TAG[1:]}+tpfix.1\n"  # its first revision
    assert problems(Line.at(folder)) == []  # CHANGELOG.md's entry, with the fingerprint
    left = [n for n, s in ours["patches"].items() if s == "conflicts"]
    for name, status in ours["patches"].items():
        assert (folder / "conflicts" / name).is_dir() == (status == "conflicts"), name
        assert (folder / name).exists() == (name in carried), name
    # the conflicting patches are listed to port by hand; the committed line
    # is that port: every patch not absorbed, under its name, in order
    (said,) = [x for x in proc.stdout.splitlines() if x.startswith("to port by hand")]
    assert said.endswith(": " + ", ".join(left))
    assert read_series(get_line(TAG).series) == [
        n for n, s in ours["patches"].items() if s != "absorbed"
    ]
    # the absorbed verdict of the FlashInfer pin came from its scenario, run
    # on a v0.33.0 tree
    assert "check bug_c:import_flashinfer_all_reduce: v0.33.0 green (fixed)" in proc.stdout


def test_an_existing_line_is_refused_and_kept(made):
    copy, _ = made
    before = sorted(p.name for p in (copy / "patches" / TAG).iterdir())
    proc = _newline(copy, TAG)
    assert proc.returncode == 2
    assert f"patches/{TAG} exists: the line is already there" in proc.stderr
    assert sorted(p.name for p in (copy / "patches" / TAG).iterdir()) == before


def test_a_leftover_of_a_killed_run_and_the_default_line_are_refused(made, tmp_path):
    copy, _ = made
    leftover = copy / "patches" / "v0.33.1"
    leftover.mkdir()
    (leftover / "pins.toml").write_text("")
    proc = _newline(copy, "v0.33.1")
    assert proc.returncode == 2
    assert "patches/v0.33.1 has no VERSION: it was left by an interrupted run" in proc.stderr
    assert list(leftover.iterdir()) == [leftover / "pins.toml"]
    proc = _newline(copy, "v0.27.1")
    assert proc.returncode == 2
    assert "patches/v0.27.1 exists: the line is already there" in proc.stderr
