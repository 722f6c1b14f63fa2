# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The one patch-file parser, series reader/writer and quilt wrapper, on small
inline patches (tpfix.core.patch_format, tpfix.core.quilt), and the scenario fields of
patch headers (tpfix.replay.harness.scenario_check, replay verdicts)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tpfix.core.patch_format import (
    Patch,
    parse_diff,
    parse_header,
    read_series,
    series_digest,
    split,
    write_series,
)
from tpfix.core.quilt import REFRESH_ARGS, Quilt, canonical, offsets
from tpfix.core.util import Fail
from tpfix.replay import bug_a, bug_b, bug_c
from tpfix.replay.harness import scenario_check

HEADER = """\
From: A Maintainer <a@example.invalid>
Date: Tue, 01 Dec 2026 10:00:00 +0000
Subject: [PATCH] [Bugfix] A subject folded
 onto a second line

Why: the first body line looks like a field but is not one.

Second paragraph.

Bug: https://github.com/vllm-project/vllm/issues/1
Related: vllm#2 (the first part),
 vllm#3 (the second)
Forwarded: no
Scenario: bug_b:run_case(**NARROW_DRAFT)
 what it shows
Claim: one claim
Claim: another
Signed-off-by: A Maintainer <a@example.invalid>
---
"""

# m.py: a changed file (two hunks, the second one's body has lines that read
# like file headers); new.py added; old.py deleted
DIFF = """\
--- a/m.py
+++ b/m.py
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
@@ -10 +10 @@ def f():
--- not a file header
+++ not one either
--- a/new.py
+++ b/new.py
@@ -0,0 +1 @@
+x = 1
--- a/old.py
+++ /dev/null
@@ -1 +0,0 @@
-y = 2
\\ No newline at end of file
"""


def test_split_at_the_first_file_diff():
    header, diff = split(HEADER + DIFF)
    assert (header, diff) == (HEADER, DIFF)
    assert split("only words\n") == ("only words\n", "")


def test_diff_files_paths_and_hunks():
    files = parse_diff(DIFF)
    assert [(d.old, d.new) for d in files] == [
        ("m.py", "m.py"),
        ("new.py", "new.py"),
        ("old.py", None),
    ]
    assert files[0].hunks == ["@@ -1,3 +1,3 @@", "@@ -10 +10 @@ def f():"]
    assert [d.deleted for d in files] == [False, False, True]
    assert files[2].path == "old.py" and files[2].hunks == ["@@ -1 +0,0 @@"]


def test_new_file_from_dev_null_is_added():
    (d,) = parse_diff("--- /dev/null\n+++ b/pkg/n.py\n@@ -0,0 +1 @@\n+n = 1\n")
    assert (d.old, d.new, d.added, d.path) == (None, "pkg/n.py", True, "pkg/n.py")


def test_header_fields_body_and_trailers():
    h = Patch.parse(HEADER + DIFF, "0001-x.patch").header
    assert h.mail_field("from") == "A Maintainer <a@example.invalid>"
    assert h.mail_field("Subject") == "[PATCH] [Bugfix] A subject folded onto a second line"
    assert h.mail_field("Date") == "Tue, 01 Dec 2026 10:00:00 +0000"
    assert h.body == (
        "Why: the first body line looks like a field but is not one.\n\nSecond paragraph."
    )
    assert [k for k, _ in h.trailers] == [
        "Bug",
        "Related",
        "Forwarded",
        "Scenario",
        "Claim",
        "Claim",
        "Signed-off-by",
    ]
    assert h.get("related") == "vllm#2 (the first part), vllm#3 (the second)"
    assert h.get_all("Claim") == ["one claim", "another"]
    assert h.get("Scenario") == "bug_b:run_case(**NARROW_DRAFT) what it shows"
    assert h.get("Applied-Upstream") is None


def test_header_without_trailer_block_is_all_body():
    h = parse_header("Subject: s\n\nJust words.\nMore words.\n---\n")
    assert (h.body, h.trailers) == ("Just words.\nMore words.", [])


def test_stray_line_in_the_trailer_block_is_an_error():
    with pytest.raises(Fail, match=r"0002-y.patch: header line 'not indented'"):
        parse_header(
            "Subject: s\n\nWhy.\n\nBug: https://x.invalid/1\nnot indented\n", "0002-y.patch"
        )


def test_series_read_write_and_digest(tmp_path: Path):
    series = tmp_path / "series"
    assert read_series(series) == []
    series.write_text("# comment\n0001-a.patch -p1\n\n0002-b.patch  # trailing\n")
    assert read_series(series) == ["0001-a.patch", "0002-b.patch"]
    for n, text in (("0001-a.patch", "a"), ("0002-b.patch", "b")):
        (tmp_path / n).write_text(text)
    digest = series_digest(read_series(series), tmp_path)
    write_series(series, ["0001-a.patch", "0002-b.patch"])
    assert series.read_text() == "0001-a.patch\n0002-b.patch\n"
    assert series_digest(read_series(series), tmp_path) == digest  # comments do not count
    assert series_digest(["0002-b.patch", "0001-a.patch"], tmp_path) != digest  # order does
    (tmp_path / "0002-b.patch").write_text("b2")
    assert series_digest(read_series(series), tmp_path) != digest  # content does


# -- quilt, the real binary ------------------------------------------------------------

needs_quilt = pytest.mark.skipif(shutil.which("quilt") is None, reason="quilt not installed")
LINES = "".join(f"line {i}\n" for i in range(1, 21))
PATCH = HEADER + (
    "--- a/m.py\n+++ b/m.py\n@@ -8,7 +8,7 @@\n line 8\n line 9\n line 10\n-line 11\n"
    "+line 11 fixed\n line 12\n line 13\n line 14\n"
)


def _quilt(tmp_path: Path, content: str, patch: str = PATCH) -> Quilt:
    tree, patches = tmp_path / "tree", tmp_path / "patches"
    tree.mkdir()
    patches.mkdir()
    (tree / "m.py").write_text(content)
    (patches / "0001-x.patch").write_text(patch)
    write_series(patches / "series", ["0001-x.patch"])
    return Quilt(tree, patches)


def test_canonical_options():
    assert canonical(["push", "-a"]) == ["push", "--fuzz=0", "-a"]
    assert canonical(("refresh",)) == ["refresh", *REFRESH_ARGS]
    assert canonical(["pop"]) == ["pop"]


@needs_quilt
def test_exact_push_then_canonical_refresh_reproduces_the_patch(tmp_path: Path):
    q = _quilt(tmp_path, LINES)
    q.push_exact("0001-x.patch", tag="v9")
    assert "line 11 fixed\n" in (q.tree / "m.py").read_text()
    q.refresh()
    assert (q.patches / "0001-x.patch").read_text() == PATCH  # header kept, same bytes


@needs_quilt
def test_interactive_push_is_exact(tmp_path: Path):
    # maint.series' `push`: --fuzz=0 is added, so a fuzzy hunk is refused
    q = _quilt(tmp_path, LINES.replace("line 8\n", "line 8 upstream\n"))
    assert q.interactive("push", "0001-x.patch") != 0
    assert q("push", "--fuzz=2", "0001-x.patch").returncode == 0  # it applies with fuzz
    assert q.interactive("pop") == 0


@needs_quilt
def test_an_offset_is_a_failure_naming_the_patch_and_file(tmp_path: Path):
    q = _quilt(tmp_path, "new 1\nnew 2\n" + LINES)
    with pytest.raises(Fail, match=r"0001-x.patch: applies only with an offset/fuzz in m.py"):
        q.push_exact("0001-x.patch", tag="v9")
    # the generic call is quilt as given: it pushes with the offset, which offsets() finds
    assert q("pop").returncode == 0
    out = q("push", "--fuzz=0", "0001-x.patch")
    found = offsets(out.stdout + out.stderr)
    assert len(found) == 1 and "offset 2 lines" in found[0], out.stdout


@needs_quilt
def test_a_conflict_is_explained(tmp_path: Path):
    q = _quilt(tmp_path, LINES.replace("line 11\n", "line 11 upstream\n"))
    with pytest.raises(Fail, match=r"0001-x.patch does not apply to v9 \(file m.py\): Hunk #1"):
        q.push_exact("0001-x.patch", tag="v9")
    assert (q.tree / "m.py").read_text() == LINES.replace("line 11\n", "line 11 upstream\n")


@needs_quilt
def test_a_listed_patch_must_exist(tmp_path: Path):
    q = _quilt(tmp_path, LINES)
    with pytest.raises(Fail, match=r"lists 0009-gone.patch, but .* does not exist"):
        q.push_exact("0009-gone.patch", tag="v9")


# -- Scenario: fields and verdicts ------------------------------------------------------


def test_scenario_field_resolves_function_kwargs_and_verdict():
    c = scenario_check("bug_b:run_case(**NARROW_DRAFT) every request fits", "p")
    assert (c.spec, c.why, c.kwargs) == ("bug_b:run_case", "every request fits", bug_b.NARROW_DRAFT)
    assert c.passes is bug_b.check_run_case
    assert scenario_check("bug_a:warm_start shows it").kwargs == {}


@pytest.mark.parametrize(
    "value,message",
    [
        ("bug_a.warm_start why", "is not module:function"),
        ("bug_a:warm_start", "does not say what it shows"),
        ("bug_z:f why", "no module tpfix/replay/bug_z.py"),
        ("bug_a:nothing why", "tpfix.replay.bug_a has no nothing()"),
        ("bug_a:two_engines why", "has no check_two_engines()"),
        ("bug_b:run_case(**MiB) why", "bug_b.MiB is not a dict"),
    ],
)
def test_bad_scenario_field_is_named(value: str, message: str):
    with pytest.raises(Fail, match=rf"^0003-p.patch: Scenario: .*{message}"):
        scenario_check(value, "0003-p.patch")


def test_verdicts_tell_fixed_bug_and_undecided_apart():
    seed = {"error": "ValueError", "message": "x exceeds workspace max_token_num (8192)"}
    assert bug_a.check_warm_start({"forward": {}}) is True
    assert bug_a.check_warm_start(seed) is False
    assert bug_a.check_warm_start({"error": "ValueError", "message": "other"}) is None
    ok = {"failures": 0, "unfused": 0, "checked": 32}
    assert bug_b.check_run_case(ok) is True
    assert bug_b.check_run_case({**ok, "failures": 1}) is False
    assert bug_b.check_run_case({**ok, "checked": 0}) is False
    assert bug_b.check_run_case({"error": "ImportError"}) is None
    check = bug_c.check_import_flashinfer_all_reduce
    assert check({"fi_ar_available": True}) is True
    assert check({"fi_ar_available": False}) is False
    assert (
        check({"error": "TypeError", "message": "type 'array.array' is not subscriptable"}) is False
    )
    assert check({"error": "ImportError", "message": "array.array"}) is None
