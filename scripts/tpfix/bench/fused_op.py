#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Per-call Python cost of vLLM's fused all-reduce + RMSNorm op, the stock
op (a line's tree before the first patch that changes the fusion pass's
module) next to the patched series' op, in one run.

Both op bodies run side by side in ONE interpreter on the patched tree
(scripts/tpfix/bench/measure.py:op_overhead_ab): the stock tree's
``call_trtllm_fused_allreduce_norm`` is compiled from its source into the
patched module's namespace, so that the two differ in their own code only,
not in the process they run in (two processes differed by a few tenths of
a microsecond, more than the cost measured).  FlashInfer's launch is a
no-op, so the figure is vLLM's own per-call overhead in eager mode (with
CUDA graphs the op's Python runs only at capture).  Rounds alternate which
op runs first; the added cost printed is the median of the rounds'
differences, with the median and best round of each op; an A/A run first
(the patched op against its own source, compiled the same way) prints the
harness's own bias.

    build/venv/bin/python -m tpfix.bench.fused_op [--line v0.34.0] [--rounds 21]
"""

from __future__ import annotations

import argparse

FUSED_OP = "vllm/compilation/passes/fusion/allreduce_rms_fusion.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=20000, help="calls per round and op")
    ap.add_argument("--line", default=None, help="release line (default: VERSION's)")
    args = ap.parse_args()
    from tpfix.core.lines import get_line
    from tpfix.core.patch_format import read_patch, read_series
    from tpfix.replay.harness import run_scenario, tree_after, tree_before

    line = get_line(args.line)
    names = read_series(line.series)
    first = next(n for n in names if FUSED_OP in read_patch(line.patches / n).diff)
    stock = f"{line.tag} before {first[:4]}"
    stock_file = tree_before(first, line) / FUSED_OP
    patched = tree_after(names[-1], line)
    print(f"stock: {stock}; patched: {line.tag} + its whole series; one interpreter")
    # the harness's own bias: the patched op against its own source compiled
    # as the stock one is (an A/A run), then each backend's A/B
    runs = [("A/A", "trtllm", patched / FUSED_OP)]
    runs += [(backend, backend, stock_file) for backend in ("trtllm", "mnnvl")]
    for label, backend, source in runs:
        r = run_scenario(
            patched,
            "tpfix.bench.measure:op_overhead_ab",
            timeout=3000,
            stock_file=str(source),
            backend=backend,
            rounds=args.rounds,
            calls=args.calls,
        )
        if "error" in r:
            raise SystemExit(f"{label}: {r}")
        us = {k: v * 1e6 for k, v in r.items() if isinstance(v, float)}
        if label == "A/A":
            print(f"A/A     the patched op against itself: {us['added_median']:+.3f} us (bias)")
            continue
        print(
            f"{backend:6}  stock {us['stock_median']:.3f} us/call (best {us['stock_best']:.3f})"
            f"   patched {us['patched_median']:.3f} us/call (best {us['patched_best']:.3f})"
            f"   added {us['added_median']:+.3f} us (median of {r['rounds']} rounds"
            f" of {r['calls']} calls; patched op's extra kwargs: "
            f"{sorted(set(r['patched_kwargs']) - set(r['stock_kwargs'])) or 'none'})"
        )


if __name__ == "__main__":
    main()
