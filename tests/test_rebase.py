# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The rebase report's classification (scripts/tpfix/maint/rebase.py,
`classify`) on small synthetic trees, with the real quilt: a patch that
applies, one refreshed at an offset, a 3-way merge, a conflict with its
hunks, one absorbed upstream (reverse-applies), and an absorbed verdict that
needs a check which tells the trees apart.  The real report on the newest
line: test_upstream_port.py.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from tpfix.core.patch_format import read_series
from tpfix.core.quilt import Quilt
from tpfix.maint.rebase import Trees, classify
from tpfix.replay.harness import Check


def _lines(changes: dict[int, str] | None = None, n: int = 40) -> str:
    changes = changes or {}
    return "".join(changes.get(i, f"line {i}") + "\n" for i in range(1, n + 1))


def _diff(before: str, after: str, path: str = "m.py") -> str:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.write_text(before)
        b.write_text(after)
        proc = subprocess.run(
            ["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}", str(a), str(b)],
            capture_output=True,
            text=True,
        )
    return proc.stdout


def _case(tmp_path: Path, target_text: str, checks=(), runner=None) -> dict:
    """Patch: lines 10 and 16 of a 40-line file change; classify it on a
    target whose m.py is `target_text`."""
    before, after = _lines(), _lines({10: "line 10 fixed", 16: "line 16 fixed"})
    for name, text in (("before", before), ("after", after), ("target", target_text)):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "m.py").write_text(text)
    patchfile = tmp_path / "0001-fix.patch"
    patchfile.write_text(
        "From: A <a@example.invalid>\nSubject: fix\n\nWhy.\n---\n" + _diff(before, after)
    )
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "series").write_text("")
    q = Quilt(tmp_path / "target", tmp_path / "out")
    origin = Trees(tmp_path / "before", tmp_path / "after")
    rec = classify("0001-fix.patch", patchfile, q, origin, list(checks), runner)
    rec["_result"] = (tmp_path / "target" / "m.py").read_text()
    rec["_expected"] = after
    rec["_carried"] = read_series(tmp_path / "out" / "series")
    return rec


def test_classify_applies(tmp_path):
    rec = _case(tmp_path, _lines())
    assert rec["status"] == "applies"
    assert rec["_result"] == rec["_expected"] and rec["_carried"] == ["0001-fix.patch"]


def test_classify_offset_is_refreshed(tmp_path):
    rec = _case(tmp_path, "new 1\nnew 2\n" + _lines())
    assert (rec["status"], rec["how"]) == ("applies-with-changes", "offset/fuzz")
    assert "offset 2 lines" in rec["changes"][0]
    refreshed = (tmp_path / "out" / "0001-fix.patch").read_text()
    assert refreshed.startswith("From: A <a@example.invalid>\nSubject: fix\n\nWhy.\n")
    assert "@@ -9,13 +9,13 @@" in refreshed  # was -7,13: refreshed by quilt


def test_classify_three_way_merge(tmp_path):
    # line 13 sits inside the patch's only hunk (lines 7-19), apart from 10/16
    rec = _case(tmp_path, _lines({13: "line 13 upstream"}))
    assert (rec["status"], rec["how"]) == ("applies-with-changes", "3-way merge")
    assert rec["hunks_before_merge"][0]["hunk"] == 1
    assert rec["_result"] == _lines(
        {10: "line 10 fixed", 13: "line 13 upstream", 16: "line 16 fixed"}
    )
    refreshed = (tmp_path / "out" / "0001-fix.patch").read_text()
    assert refreshed.startswith("From: A <a@example.invalid>\nSubject: fix\n")
    assert "+line 10 fixed" in refreshed and " line 13 upstream" in refreshed


def test_classify_conflict_lists_hunks(tmp_path):
    rec = _case(tmp_path, _lines({10: "line 10 changed upstream"}))
    assert rec["status"] == "conflicts"
    (h,) = rec["hunks"]
    assert (h["file"], h["hunk"], h["line"]) == ("m.py", 1, 7)
    assert rec["merge_conflicts"] == {"m.py": 1}
    assert rec["_result"] == _lines({10: "line 10 changed upstream"})  # untouched
    assert rec["_carried"] == []


def test_classify_absorbed_reverse_applies(tmp_path):
    rec = _case(tmp_path, _lines({10: "line 10 fixed", 16: "line 16 fixed"}))
    assert (rec["status"], rec["how"]) == ("absorbed", "reverse-applies")


def test_classify_absorbed_needs_a_discriminating_check(tmp_path):
    check = Check("x:y", "fixed", lambda r: r["ok"])
    upstream_fixed_elsewhere = _lines({10: "line 10 changed upstream"})

    def red_before(tree, c):
        return {"passed": tree.name != "before"}

    rec = _case(tmp_path / "a", upstream_fixed_elsewhere, [check], red_before)
    assert (rec["status"], rec["how"]) == ("absorbed", "checks")

    def always_green(tree, c):  # passes on the old tree too: proves nothing
        return {"passed": True}

    rec = _case(tmp_path / "b", upstream_fixed_elsewhere, [check], always_green)
    assert rec["status"] == "conflicts"
