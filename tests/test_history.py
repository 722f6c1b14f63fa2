# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""One version, one content: a revision, once committed, names one content forever.

The walk (tpfix.maint.revision.history_violations) reads every commit reachable
from HEAD (each counts as landed) and what each line folder's VERSION names
there (lines.fingerprint); this repository's history passes with exactly the
revisions patches/HISTORY-EXCEPTIONS.toml records.  The rest proves the check
can fail, on clones of this repository in tmp_path: an edit committed under a
revision that landed (its changelog fingerprint updated too, so the per-line
check passes) is named with its commit, and so is an edit that a later commit
bumps; the same edit with its bump in one commit passes; an exception covers
no commit after its `through`; a shallow clone is said to be one.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from repo_copy import run_in_copy

from tpfix.core.lines import FINGERPRINT, Line, fingerprint, line_names, revision_problems
from tpfix.core.patch_format import read_series
from tpfix.core.util import ROOT
from tpfix.maint.revision import EXCEPTIONS, history_violations, walk


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, text=True, capture_output=True
    ).stdout.strip()


def test_every_revision_names_one_content_over_this_history():
    w = walk()
    assert not w.shallow, f"{ROOT} is a shallow clone: its history cannot be checked"
    assert w.exceptions is not None, f"{EXCEPTIONS} is not committed at HEAD"
    through = tomllib.loads(w.exceptions)["through"]
    assert through in {c.sha for c in w.commits}, f"the walk did not see {through}"
    found, problems = history_violations()
    assert not problems, "\n".join(problems)
    recorded = {e["version"] for e in tomllib.loads(w.exceptions)["revision"]}
    assert {v.version for v in found} == recorded
    for name in line_names():  # what each line names now is the one content it names after
        line = Line.at(ROOT / "patches" / name)
        now = {v.version: v for v in found}.get(line.version_file.read_text().strip())
        if now:
            assert now.contents[-1].fingerprint == fingerprint(line)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A clone of this repository's committed history to commit into (sharing its
    objects: what the tests commit goes into the clone's own)."""
    dest = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(dest)],
        check=True,
    )
    _git(dest, "checkout", "--quiet", _git(ROOT, "rev-parse", "HEAD"))
    _git(dest, "config", "user.email", "test@example.invalid")
    _git(dest, "config", "user.name", "test")
    return dest


def _edit(clone: Path) -> Line:
    """The default line's last patch edited by one byte, the newest changelog
    entry's fingerprint updated to match (what the per-line check asks for)."""
    line = Line.at(clone / "patches" / _git(clone, "show", "HEAD:VERSION"))
    patch = line.patches / read_series(line.series)[-1]
    patch.write_bytes(patch.read_bytes() + b"\n")
    text = line.changelog.read_text()
    line.changelog.write_text(
        FINGERPRINT.sub(f"fingerprint: sha256:{fingerprint(line)}", text, count=1)
    )
    return line


def _commit(clone: Path, message: str) -> str:
    _git(clone, "commit", "--quiet", "-am", message)
    return _git(clone, "rev-parse", "HEAD")


def _new(clone: Path) -> list[tuple[str, list[str]]]:
    """(revision, the commits of each content not tolerated) of every violation."""
    found, problems = history_violations(clone)
    new = [(v.version, [x.sha for x in v.new]) for v in found if v.new]
    assert len(problems) == len(new), problems
    return new


def test_a_planted_edit_under_a_landed_revision_is_named_with_its_commit(clone: Path):
    assert _new(clone) == []
    line = _edit(clone)
    assert revision_problems(line) == []  # the per-line check cannot see it
    planted = _commit(clone, "an edit under a landed revision")
    version = line.version_file.read_text().strip()
    assert _new(clone) == [(version, [planted])]
    (said,) = history_violations(clone)[1]
    assert f"{version} names" in said and planted[:7] in said and "one content forever" in said


def test_an_edit_bumped_only_by_the_next_commit_still_fails(clone: Path):
    line = _edit(clone)
    version = line.version_file.read_text().strip()
    planted = _commit(clone, "an edit, its bump to follow")
    bumped = run_in_copy(clone, "-m", "tpfix.maint.revision", "bump", line.tag, "Later.")
    assert bumped.returncode == 0, bumped.stderr
    _commit(clone, "the bump")
    assert _new(clone) == [(version, [planted])]


def test_the_edit_with_its_bump_in_one_commit_passes(clone: Path):
    line = _edit(clone)
    bumped = run_in_copy(clone, "-m", "tpfix.maint.revision", "bump", line.tag, "What changed.")
    assert bumped.returncode == 0, bumped.stderr
    assert revision_problems(line) == []
    # the README's versions table names the new revision's wheel and image
    version = line.version_file.read_text().strip()
    assert "versions table updated" in bumped.stdout
    assert f"vllm-{version}-" in (clone / "README.md").read_text()
    _commit(clone, "an edit with its bump")
    assert _new(clone) == []
    checked = run_in_copy(clone, "-m", "tpfix.maint.revision", "check")
    assert checked.returncode == 0, checked.stderr


def test_an_exception_covers_no_commit_after_through(clone: Path):
    """A recorded revision's older content, committed again, is a new violation."""
    w = walk(clone)
    version, contents = next(
        (v, fps) for (_, v), fps in w.names.items() if len(fps) > 1 and v in w.exceptions
    )
    tag = "v" + version.split("+")[0]
    old = next(iter(contents.values()))[0]  # a commit naming its first content
    _git(clone, "rm", "-r", "--quiet", "--ignore-unmatch", f"patches/{tag}")
    _git(clone, "checkout", old.sha, "--", f"patches/{tag}")
    planted = _commit(clone, f"{tag} as in {old.short}")
    assert _new(clone) == [(version, [planted])]


def test_a_shallow_clone_says_what_it_cannot_check(tmp_path: Path):
    dest = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "--quiet", "--depth", "3", f"file://{ROOT}", str(dest)], check=True
    )
    problems = history_violations(dest)[1]
    assert any("is a shallow clone" in p and "cannot be checked" in p for p in problems)
