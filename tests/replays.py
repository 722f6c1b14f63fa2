# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Shared by the replay tests: which patch of a line fixes bug C, and bug A's
suite of named cases on the trees of a release line's series, run once per
tree in a pytest session (test_bug_a's red/green checks and test_bisect's
prefix checks read the same results)."""

from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpfix.core.lines import Line, get_line
from tpfix.core.patch_format import read_series
from tpfix.replay.harness import patch_checks, run_scenario
from tpfix.stages.patch import cached_tree

BUG_C = "bug_c:import_flashinfer_all_reduce"


def bug_c_patch(line: Line) -> str | None:
    """The patch of `line`'s series whose `Scenario:` is bug C's import (it
    re-pins FlashInfer); None where the tag's own pin has the fix."""
    names = read_series(line.series)
    fixes = [n for n in names if BUG_C in [c.spec for c in patch_checks(line.patches / n)]]
    assert len(fixes) <= 1, fixes
    return fixes[0] if fixes else None


def source_line(line: Line) -> Line:
    """The line whose series `line`'s patches were first written on: follow
    each line's rebase.json ("from", written by maint.start_line) back to a
    line that was not started from another (`line` itself for such a one)."""
    seen = [line.tag]
    while (rebase := line.patches / "rebase.json").exists():
        line = get_line(json.loads(rebase.read_text())["from"])
        assert line.tag not in seen, f"rebase.json loop: {seen + [line.tag]}"
        seen.append(line.tag)
    return line


def prefix_trees(tag: str) -> list[Path]:
    """The trees of every prefix of `tag`'s series: pristine, then the first
    k patches for k = 1..n."""
    line = get_line(tag)
    names = read_series(line.series)
    return [cached_tree(line, upto="")] + [cached_tree(line, upto=n) for n in names]


@functools.cache
def _suite(tree: Path) -> dict:
    res = run_scenario(tree, "bug_a:suite", timeout=3000)
    assert "error" not in res, (tree, res)
    return res


def suites(trees: list[Path]) -> dict[Path, dict]:
    """bug_a:suite on each tree (all its cases), one subprocess per tree, two
    at a time; each tree's result is computed once per session."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(trees, pool.map(_suite, trees), strict=True))
