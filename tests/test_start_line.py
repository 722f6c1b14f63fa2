# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The next release, prepared: python -m tpfix.maint.start_line TAG.

Every line but the default one (the lines are read from patches/, so a line
a maintainer starts is covered too) is made again from the default line's
series, in a copy of this repository without patches/TAG/, as a maintainer
would on the day of a release: its pins must equal the committed ones (same
files, sha256, size, CUDA, the versions table's facts) and its classification
the committed patches/TAG/rebase.json.  The downloads are real (pip); the
scenario checks are the real replays.
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

from tpfix.audit.support_matrix import WHEEL_FACTS
from tpfix.core.lines import Line, get_line, line_names, load_pins
from tpfix.core.lines import revision_problems as problems
from tpfix.core.patch_format import read_series
from tpfix.core.util import ROOT, Fail
from tpfix.maint.port_facts import FILE, carried_by_name, new_patches
from tpfix.maint.port_facts import load as load_facts
from tpfix.release.triage import load_triage

# downloads the sdist and both official wheels of each line, replays scenarios
pytestmark = pytest.mark.slow

DEFAULT = line_names()[0]


def _without_pin(text: str, version: str) -> str:
    """pins/flashinfer.toml's text without the flashinfer-python `version` artifact."""
    start = text.find(f'[[artifact]]\nproject = "flashinfer-python"\nversion = "{version}"')
    if start < 0:
        return text
    end = text.find("[[artifact]]", start + 1)
    return text[:start] + (text[end:] if end >= 0 else "")


# every line start_line made (its rebase.json says from which line)
MADE = [t for t in line_names() if (get_line(t).patches / "rebase.json").exists()]


@pytest.fixture(scope="module", params=MADE)
def made(request, tmp_path_factory) -> tuple[str, Path, subprocess.CompletedProcess]:
    tag = request.param
    copy = tmp_path_factory.mktemp(f"start-{tag}") / "repo"
    for part in ("scripts", "pins", "patches", "ci"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "VERSION", copy / "VERSION")
    shutil.rmtree(copy / "patches" / tag)
    # the README as it was before the line: its versions table without the row
    readme = (ROOT / "README.md").read_text().splitlines(keepends=True)
    row = f"| `--line {tag}` | {tag} |"
    assert sum(x.startswith(row) for x in readme) == 1
    (copy / "README.md").write_text("".join(x for x in readme if not x.startswith(row)))
    # as on the day of a release: the FlashInfer the new tag pins has no pin yet
    fi_version = tomllib.loads(get_line(tag).pins.read_text())["flashinfer"]
    fi = copy / "pins" / "flashinfer.toml"
    fi.write_text(_without_pin(fi.read_text(), fi_version))
    assert f'version = "{fi_version}"' not in fi.read_text()
    started = json.loads((get_line(tag).patches / "rebase.json").read_text())
    repins = [f"--repin={n}=={v}" for n, v in started.get("repins", {}).items()]
    proc = _start_line(copy, tag, "--from", started["from"], *repins)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tag, copy, proc


def _start_line(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(copy / "scripts"))
    return subprocess.run(
        [sys.executable, "-m", "tpfix.maint.start_line", *args],
        cwd=copy,
        env=env,
        text=True,
        capture_output=True,
        timeout=1800,
    )


def test_pins_equal_the_committed_ones(made):
    tag, copy, _ = made
    committed = load_pins(get_line(tag).pins)
    ours = load_pins(copy / "patches" / tag / "pins.toml")
    release = lambda arts: sorted((a for a in arts if a.role != "test"), key=str)  # noqa: E731
    assert release(ours) == release(committed)
    # the FlashInfer the scenario checks import, pinned from the downloaded file
    text = (copy / "patches" / tag / "pins.toml").read_text()
    # (the re-pinned one where start_line --repin replaced upstream's pin)
    facts = tomllib.loads(text)
    fi_version = facts.get("flashinfer-repinned", facts["flashinfer"])
    pinned = [*load_pins(ROOT / "pins" / "flashinfer.toml"), *committed]
    fi = [a for a in pinned if a.role == "test" and a.version == fi_version]
    assert [a for a in ours if a.role == "test"] == fi
    assert tomllib.loads(text)["cuda"] == get_line(tag).official_cuda()
    # the versions table's facts, from the downloaded wheels and sdist
    ours, theirs = tomllib.loads(text), tomllib.loads(get_line(tag).pins.read_text())
    for key in (*WHEEL_FACTS, "image-python"):
        assert ours[key] == theirs[key], key
    # a re-pin: start_line --repin's, as rebase.json records it
    repinned = json.loads((get_line(tag).patches / "rebase.json").read_text()).get("repins", {})
    assert ours.get("flashinfer-repinned") == repinned.get("flashinfer-python")
    assert ours.get("flashinfer-repinned") == theirs.get("flashinfer-repinned")


def test_classification_equals_the_committed_one(made):
    tag, copy, proc = made
    folder, line = copy / "patches" / tag, get_line(tag)
    ours = json.loads((folder / "rebase.json").read_text())
    committed = json.loads((get_line(tag).patches / "rebase.json").read_text())
    assert ours == committed
    carried = [n for n, s in ours["patches"].items() if s in ("applies", "applies-with-changes")]
    # the re-pins (start_line --repin) first, each a patch of its own
    first = [f"0001-repin-{n}-{v}.patch" for n, v in ours.get("repins", {}).items()]
    assert (folder / "series").read_text().split() == first + carried
    assert (folder / "VERSION").read_text() == f"{tag[1:]}+tpfix.1\n"  # its first revision
    # no advisory analysis yet, as tpfix.release.triage reads it; the README's versions
    # table has the new line's row again (the fixture removed it), at tpfix.1
    assert load_triage(Line.at(folder)) == (folder / "advisories.toml", {})
    (row,) = [x for x in (copy / "README.md").read_text().splitlines() if f"| {tag} |" in x]
    assert row.startswith(f"| `--line {tag}` | {tag} |") and f"-{tag[1:]}+tpfix.1-" in row
    assert problems(Line.at(folder)) == []  # CHANGELOG.md's entry, with the fingerprint
    # build/venv's replay lock resolved again, with the new line's common.txt
    head = (copy / "ci" / "requirements-replay.lock").read_text().splitlines()[2]
    assert head.endswith(", ".join(line_names())) and tag in head, head
    assert "warning: ci/*.lock" not in proc.stderr, proc.stderr[-2000:]
    left = [n for n, s in ours["patches"].items() if s == "conflicts"]
    for name, status in ours["patches"].items():
        assert (folder / "conflicts" / name).is_dir() == (status == "conflicts"), name
        assert (folder / name).exists() == (name in carried), name
    # the conflicting patches are listed to port by hand; the committed line
    # is that port: every patch not absorbed, under its name, in order
    if left:
        (said,) = [x for x in proc.stdout.splitlines() if x.startswith("to port by hand")]
        assert said.endswith(": " + ", ".join(left))
    # (and the patches of the line only, `new = true` in its port.toml; a
    # source patch carried in another shape or dropped names them in `ported_as`)
    committed_facts = tomllib.loads((line.patches / FILE).read_text())
    new = set(new_patches(committed_facts))
    assert [
        n for n in read_series(get_line(tag).series) if n not in new - set(first)
    ] == first + carried_by_name(committed_facts, ours["patches"])
    for name in first:  # the committed re-pin is the one start_line writes
        assert (folder / name).read_text() == (line.patches / name).read_text(), name
    # port.toml: what the report recorded, as the committed facts say; each
    # `why` left to the maintainer (load refuses it so)
    recorded, facts = (tomllib.loads((f / FILE).read_text()) for f in (folder, line.patches))
    for name, rec in recorded["report"].items():
        assert rec.pop("why") == ""
        want = {k: v for k, v in facts["report"][name].items() if k in rec}
        want["checks"] = [
            {k: v for k, v in c.items() if k not in ("result", "contains")}
            for c in want.get("checks", [])
        ]
        assert {**rec, "checks": rec.get("checks", [])} == want, name
    assert list(recorded.get("port", {})) == first + carried
    with pytest.raises(Fail, match=r"port.toml \[report.'0.*'\]: no `why`"):
        load_facts(Line.at(folder))
    # an absorbed verdict came from the patch's scenario, run on a tree of the tag
    if "absorbed" in ours["patches"].values():
        assert f": {tag} green (fixed)" in proc.stdout


def test_an_existing_line_is_refused_and_kept(made):
    tag, copy, _ = made
    before = sorted(p.name for p in (copy / "patches" / tag).iterdir())
    proc = _start_line(copy, tag)
    assert proc.returncode == 2
    assert f"patches/{tag} exists: the line is already there" in proc.stderr
    assert sorted(p.name for p in (copy / "patches" / tag).iterdir()) == before


def test_a_leftover_of_a_killed_run_and_the_default_line_are_refused(made, tmp_path):
    _, copy, _ = made
    leftover = copy / "patches" / "v99.0.0"
    leftover.mkdir(exist_ok=True)
    (leftover / "pins.toml").write_text("")
    proc = _start_line(copy, "v99.0.0")
    assert proc.returncode == 2
    assert "patches/v99.0.0 has no VERSION: it was left by an interrupted run" in proc.stderr
    assert list(leftover.iterdir()) == [leftover / "pins.toml"]
    proc = _start_line(copy, DEFAULT)
    assert proc.returncode == 2
    assert f"patches/{DEFAULT} exists: the line is already there" in proc.stderr
