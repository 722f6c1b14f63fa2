#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Per-call Python cost of vLLM's fused all-reduce + RMSNorm op, v0.27.1 (the
tree before the series' first fix) next to the patched series, in one run.

Each tree's REAL ``call_trtllm_fused_allreduce_norm`` runs in its own
subprocess (scripts/tpfix/bench/measure.py:op_overhead) with FlashInfer's launch
replaced by a no-op, so the figure is vLLM's own per-call overhead in eager
mode (with CUDA graphs the op's Python runs only at capture).  Rounds
alternate between the trees; the best round of each is printed.

    build/venv/bin/python -m tpfix.bench.fused_op [--rounds 3]
"""

from __future__ import annotations

import argparse

PATCH = "0002-standalone-allreduce-asks-the-workspace.patch"  # pristine + 0001 before it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from tpfix.core.lines import get_line
    from tpfix.core.patch_format import read_series
    from tpfix.replay.harness import run_scenario, tree_after, tree_before

    trees = {
        "v0.27.1": tree_before(PATCH),
        "patched": tree_after(read_series(get_line().series)[-1]),
    }
    for backend in ("trtllm", "mnnvl"):
        best = {k: float("inf") for k in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                r = run_scenario(tree, "tpfix.bench.measure:op_overhead", backend=backend)
                if "error" in r:
                    raise SystemExit(f"{name}: {r}")
                best[name] = min(best[name], r["seconds_per_call"])
        us = {k: v * 1e6 for k, v in best.items()}
        print(
            f"{backend:6}  v0.27.1 {us['v0.27.1']:.3f} us/call   patched "
            f"{us['patched']:.3f} us/call   added {us['patched'] - us['v0.27.1']:+.3f} us"
        )


if __name__ == "__main__":
    main()
