#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Per-call Python cost of vLLM's fused all-reduce + RMSNorm op, a line's
tree before the first patch that changes the fusion pass's module (stock)
next to the patched series, in one run.

Each tree's REAL ``call_trtllm_fused_allreduce_norm`` runs in its own
subprocess (scripts/tpfix/bench/measure.py:op_overhead) with FlashInfer's launch
replaced by a no-op, so the figure is vLLM's own per-call overhead in eager
mode (with CUDA graphs the op's Python runs only at capture).  Rounds
alternate between the trees; the best round of each is printed.

    build/venv/bin/python -m tpfix.bench.fused_op [--line v0.34.0] [--rounds 3]
"""

from __future__ import annotations

import argparse

FUSED_OP = "vllm/compilation/passes/fusion/allreduce_rms_fusion.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--line", default=None, help="release line (default: VERSION's)")
    args = ap.parse_args()
    from tpfix.core.lines import get_line
    from tpfix.core.patch_format import read_patch, read_series
    from tpfix.replay.harness import run_scenario, tree_after, tree_before

    line = get_line(args.line)
    names = read_series(line.series)
    first = next(n for n in names if FUSED_OP in read_patch(line.patches / n).diff)
    stock = f"{line.tag} before {first[:4]}"
    trees = {
        stock: tree_before(first, line),
        "patched": tree_after(names[-1], line),
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
            f"{backend:6}  {stock} {us[stock]:.3f} us/call   patched "
            f"{us['patched']:.3f} us/call   added {us['patched'] - us[stock]:+.3f} us"
        )


if __name__ == "__main__":
    main()
