# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A line's revision only grows: what it ships changed -> bump it, with an entry.

Every line's CHANGELOG.md names its VERSION as the newest entry, with the
fingerprint (lines.fingerprint) of its series, patches and pins;
the revisions listed strictly increase.  The second half proves the check can
fail, on a copy of a line in tmp_path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tpfix.core.lines import Line, fingerprint, get_line, line_names
from tpfix.core.lines import changelog_entries as entries
from tpfix.core.lines import revision_problems as problems
from tpfix.core.patch_format import read_series
from tpfix.maint.revision import bump


@pytest.mark.parametrize("name", line_names())
def test_the_revision_and_changelog_match_what_the_line_ships(name: str):
    wrong = problems(get_line(name))
    assert not wrong, "\n".join(wrong)


@pytest.fixture
def copy(tmp_path: Path) -> Line:
    """A copy of the default line, in a folder named like it."""
    line = get_line()
    folder = tmp_path / "patches" / line.tag
    shutil.copytree(line.patches, folder)
    return Line.at(folder)


def _names(line: Line) -> list[str]:
    return read_series(line.series)


def _patch(line: Line) -> Path:
    return line.patches / _names(line)[-1]


@pytest.mark.parametrize(
    "change",
    [
        lambda line: _patch(line).write_bytes(_patch(line).read_bytes() + b"\n"),
        lambda line: line.series.write_text("\n".join(_names(line)[:-1]) + "\n"),
        lambda line: line.pins.write_text(line.pins.read_text().replace("13.0", "13.1", 1)),
    ],
    ids=["a-patch-byte", "a-patch-dropped", "pins"],
)
def test_a_change_without_a_bump_fails_and_the_bump_fixes_it(copy: Line, change):
    assert problems(copy) == []
    before = copy.version_file.read_text().strip()
    old = fingerprint(copy)
    change(copy)
    assert fingerprint(copy) != old
    (said,) = problems(copy)
    assert (
        "changed since" in said and f"run: python -m tpfix.maint.revision bump {copy.tag}" in said
    )
    new = bump(copy, "What changed, for users.")
    upstream, rev = before.split("+tpfix.")
    assert new == f"{upstream}+tpfix.{int(rev) + 1}"  # one more, whatever the patch count
    assert copy.version_file.read_text() == new + "\n"
    assert problems(copy) == []
    (newest, text), (previous, _) = entries(copy)[:2]
    assert (newest, previous) == (new, before)
    assert f"fingerprint: sha256:{fingerprint(copy)}" in text and "What changed" in text


def test_revisions_must_strictly_increase(copy: Line):
    text = copy.changelog.read_text()
    newest, _ = entries(copy)[0]
    oldest, _ = entries(copy)[-1]
    copy.changelog.write_text(text + f"\n## {newest}\n\nthe same revision twice\n")
    (said,) = problems(copy)
    assert f"{oldest} is listed above {newest}: revisions must strictly increase" in said
    higher = newest.rsplit(".", 1)[0] + ".99"
    copy.changelog.write_text(text.replace(f"## {oldest}\n", f"## {higher}\n"))
    (said,) = problems(copy)
    assert f"is listed above {higher}: revisions must strictly increase" in said


def test_version_must_be_the_newest_entry(copy: Line):
    newest, _ = entries(copy)[0]
    ahead = newest.rsplit(".", 1)[0] + ".99"
    copy.version_file.write_text(ahead + "\n")
    (said,) = problems(copy)
    assert f"VERSION: {ahead}, but " in said and f"CHANGELOG.md's newest entry is {newest}" in said
