# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Every prefix of every line's series is safe to ship (a bisect or a partial
backport lands on one): bug A's whole suite of named cases
(tpfix/replay/bug_a.py: seed starts cold and warm, CUDA-graph capture order,
creation failing on this rank or a peer, the drafter's pass collected, two
engines with and without teardown, the standalone all-reduce, fused ranges)
runs on the pristine tag and on the tree of each prefix, and no prefix is
worse than pristine: every case that runs on pristine runs there too, no
more cases end in an error, and no model fuses a shorter range (unless
pristine fused it past the fusion's byte budget).  "Pristine" includes the
line's leading dependency pins (patches that change no code, only
requirements/ and docker/: v0.27.1's FlashInfer 0.6.16.post4), without which the tag's own vLLM does
not start TP > 1 on this Python (bug C), so nothing would compare.

Runs the REAL vLLM code of each tree on the simulated device layer of
tpfix/replay/device.py (its docstring lists what is simulated).
"""

from __future__ import annotations

import tomllib

import pytest
from replays import prefix_trees, suites

from tpfix.core.lines import get_line, line_names
from tpfix.core.patch_format import diff_files, read_series

pytestmark = pytest.mark.slow


def _pins(tag: str) -> int:
    """How many patches the series starts with that change only the
    dependency pins (requirements/, and the docker/ files that repeat them),
    no code."""
    line = get_line(tag)
    names = read_series(line.series)
    k = 0
    while k < len(names):
        files = [f.path for f in diff_files(line.patches / names[k])]
        if not files or not all(f.startswith(("requirements/", "docker/")) for f in files):
            break
        k += 1
    return k


def _fused_up_to(res: dict) -> dict[str, int]:
    """{model: the end of its largest fused compile range} of a case; a model
    fused past the byte budget (fused_ranges()) is left out."""
    plans = res.get("plans") or ({"second": res["plan"]} if "plan" in res else {})
    out = {k: max((r[1] for r in p["fused_ranges"]), default=0) for k, p in plans.items()}
    for k, m in (res.get("models") or {}).items():
        if not m["over_budget"]:
            out[k] = m["fused_up_to"]
    return out


@pytest.mark.parametrize("tag", line_names())
def test_no_prefix_is_worse_than_pristine(tag):
    trees = prefix_trees(tag)
    base = _pins(tag)
    results = suites(trees[base:])  # the trees without the pins: bug C, nothing to compare
    pristine = results[trees[base]]
    crashed = sorted(c for c, r in pristine.items() if "error" in r)
    print(f"[bisect] {tag} pristine (+{base} pins): {len(crashed)}/{len(pristine)} cases fail")
    for k, tree in enumerate(trees[base + 1 :], start=base + 1):
        prefix = results[tree]
        assert set(prefix) == set(pristine), (tag, k)
        worse = [c for c, r in pristine.items() if "error" not in r and "error" in prefix[c]]
        assert not worse, (tag, k, {c: prefix[c] for c in worse})
        errors = [c for c, r in prefix.items() if "error" in r]
        assert len(errors) <= len(crashed), (tag, k, errors)
        print(f"[bisect] {tag} first {k} patches: {len(errors)} cases end in an error")
        for case, res in pristine.items():
            if "error" in res or "error" in prefix[case]:
                continue
            before, after = _fused_up_to(res), _fused_up_to(prefix[case])
            for model, end in before.items():
                assert after.get(model, 0) >= end, (tag, k, case, model, before, after)


def _left_as_upstream(tag: str) -> dict[str, dict]:
    """patches/<tag>/unfixed.toml: the cases a line leaves as its tag has them,
    each with the error it still ends in and why (absent: none)."""
    path = get_line(tag).patches / "unfixed.toml"
    facts = tomllib.loads(path.read_text()) if path.exists() else {}
    for case, fact in facts.items():
        assert set(fact) == {"error", "message", "why"} and fact["why"].strip(), (path, case)
    return facts


@pytest.mark.parametrize("tag", line_names())
def test_the_whole_series_runs_every_case(tag):
    """With the whole series every case runs to its end: the crashes
    pristine has are fixed, none is left, but those the line's unfixed.toml
    names, which end in exactly the error it names (and, by the prefix test
    above, pristine ends in an error there too)."""
    tree = prefix_trees(tag)[-1]
    last = suites([tree])[tree]
    errors = {c: r for c, r in last.items() if "error" in r}
    left = _left_as_upstream(tag)
    assert set(errors) == set(left), (tag, errors)
    for case, fact in left.items():
        assert errors[case]["error"] == fact["error"], (tag, case, errors[case])
        assert fact["message"] in errors[case]["message"], (tag, case, errors[case])
