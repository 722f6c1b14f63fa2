# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A over the configuration space: a Hypothesis property
(bug_a:property_fits) run on v0.27.1 with the dependency pin only and with
the whole series, in a subprocess each.  What runs for real and what is
simulated (the CUDA device, torch.distributed, GPU allocation, the kernels)
is test_bug_a.py's: scripts/tpfix/replay/device.py.  Slow: 60 derandomized
examples on each tree.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from replays import source_line

from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.replay.harness import run_scenario, tree_after

LINE = source_line(get_line())  # v0.27.1, whose series the bug-A patches were written on
SERIES = read_series(LINE.series)


@pytest.fixture(scope="module")
def prop():
    trees = {"before": tree_after(SERIES[0], LINE), "after": tree_after(SERIES[-1], LINE)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            k: pool.submit(run_scenario, t, "bug_a:property_fits", max_examples=60)
            for k, t in trees.items()
        }
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.slow
def test_property_every_fused_shape_fits(prop):
    """Hypothesis (derandomized: both trees see the same cases) over hidden
    sizes, draft width (none / same / any), TP 2/4/8, SM90/100/103, token
    limits and backends trtllm/mnnvl; cold and warm creation order; each
    shape a compiled graph may send checked with FlashInfer's validators and
    the strategy the tree's fused op requests.  Before: v0.27.1 (+0001);
    after: the whole series."""
    for k, r in prop.items():
        assert "error" not in r, r
        print(
            f"[bug A property] {k}: {r['failing']}/{r['cases']} cases send a "
            f"shape the workspace cannot hold (wider draft: "
            f"{r['failing_wider_draft']}, by backend: {r['by_backend']}); "
            f"fusion lost for a model in {r['fusion_lost']} cases"
        )
    assert prop["before"]["cases"] == prop["after"]["cases"] == 60
    assert prop["before"]["failing"] > 0, prop["before"]
    assert prop["after"]["failing"] == 0, prop["after"]["failing_examples"]
    assert prop["after"]["fusion_lost"] == 0
