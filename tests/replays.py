# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Shared by the replay tests: bug A's suite of named cases on the trees of a
release line's series, run once per tree in a pytest session (test_bug_a's
red/green checks and test_bisect's prefix checks read the same results)."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpfix.lines import get_line
from tpfix.patch import cached_tree
from tpfix.patch_format import read_series
from tpfix.replay.harness import run_scenario


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
