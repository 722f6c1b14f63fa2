#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""FlashInfer all-reduce fusion workspace per rank, before and after patch
0003 (bug A: created at load for every model), for the seed configuration
and a few others.

For every configuration it runs the REAL vLLM code of each tree (config,
worker init, AllReduceFusionPass for target and drafter, the fused op's lazy
creation) in a subprocess via scripts/tpfix/bench/measure.py:bench, with the
device layer simulated (no GPU: FlashInfer workspace objects are built with
FlashInfer's own sizing formulas, no memory is allocated).  It prints:

  before cold / warm   bytes v0.27.1 allocates: first caller wins, so it
                       depends on the order (cold: target pass first; warm:
                       AOT cache, the target's fused op creates it);
  after                bytes with the patch (any order);
  min need             the least FlashInfer needs so that every shape the
                       fusion budget admits fits: max over both models and
                       every token count n up to that model's own token
                       limit of FlashInfer's own requirement (trtllm: sizing
                       of the largest token*hidden product, as wide as the
                       widest model; mnnvl: get_required_buffer_size_bytes
                       with FlashInfer's AUTO choice, times its 3 Lamport
                       buffers: vLLM requests what FlashInfer's AUTO
                       picks);
  fused (after)        compile ranges in which the patched tree applies the
                       fusion, target | draft (every range up to the limit).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PATCH = "0003-allreduce-fusion-size-workspace-for-every-model.patch"
MiB = 1024 * 1024

CONFIGS = [
    # seed: Qwen3-30B-A3B (2048) + Qwen3-4B draft (2560), 2xH100
    dict(
        target_hidden=2048,
        draft_hidden=2560,
        tp=2,
        capability=90,
        max_num_batched_tokens=8192,
        backend="trtllm",
    ),
    dict(
        target_hidden=2048,
        draft_hidden=2560,
        tp=4,
        capability=90,
        max_num_batched_tokens=8192,
        backend="trtllm",
    ),
    dict(
        target_hidden=2048,
        draft_hidden=2560,
        tp=8,
        capability=90,
        max_num_batched_tokens=8192,
        backend="trtllm",
    ),
    dict(
        target_hidden=4096,
        draft_hidden=2048,
        tp=2,
        capability=90,
        max_num_batched_tokens=8192,
        backend="trtllm",
    ),
    dict(
        target_hidden=4096,
        draft_hidden=4096,
        tp=4,
        capability=100,
        max_num_batched_tokens=8192,
        backend="trtllm",
    ),
    dict(
        target_hidden=2048,
        draft_hidden=2560,
        tp=4,
        capability=100,
        max_num_batched_tokens=8192,
        backend="mnnvl",
    ),
    dict(
        target_hidden=2048,
        draft_hidden=4096,
        tp=8,
        capability=100,
        max_num_batched_tokens=2048,
        backend="mnnvl",
    ),
    dict(
        target_hidden=6144,
        draft_hidden=7168,
        tp=8,
        capability=103,
        max_num_batched_tokens=8192,
        backend="mnnvl",
    ),
    dict(
        target_hidden=5120,
        draft_hidden=None,
        tp=2,
        capability=100,
        max_num_batched_tokens=16384,
        backend="trtllm",
    ),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree-before", type=Path, help="vLLM tree without 0003")
    ap.add_argument("--tree-after", type=Path, help="vLLM tree with 0003")
    args = ap.parse_args()

    from tpfix.replay.harness import run_scenario, tree_after, tree_before

    trees = {
        "before": args.tree_before or tree_before(PATCH),
        "after": args.tree_after or tree_after(PATCH),
    }
    res = {
        k: run_scenario(t, "tpfix.bench.measure:bench", configs=CONFIGS) for k, t in trees.items()
    }
    for k, r in res.items():
        if isinstance(r, dict) and "error" in r:
            print(f"{k}: {r['error']}: {r['message']}\n{r.get('stderr', '')}")
            return 1

    # FlashInfer's own minimum for every admitted shape, computed in the tree
    # with the FlashInfer it pins (a scenario run, like the rest)
    needs = run_scenario(
        trees["after"],
        "tpfix.bench.measure:min_need",
        configs=[a["config"] for a in res["after"]],
        budgets=[a.get("budget") for a in res["after"]],
    )
    if isinstance(needs, dict):
        print(f"min_need: {needs.get('error')}: {needs.get('message')}")
        return 1

    def fmt(b):
        return f"{b / MiB:9.2f}"

    hdr = (
        f"{'target/draft':>12} {'TP':>2} {'SM':>3} {'tokens':>6} {'backend':>7} | "
        f"{'before cold':>11} {'before warm':>11} {'after':>9} {'min need':>9} "
        f"{'=min':>4} | fused ranges after (target | draft)"
    )
    print("FlashInfer all-reduce workspace per rank, MiB (bf16)")
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for b, a, need in zip(res["before"], res["after"], needs, strict=True):
        c = a["config"]
        if "error" in a or "error" in b:
            print(c, a.get("error"), b.get("error"))
            ok = False
            continue
        eq = a["cold_bytes"] == a["warm_bytes"] == need
        ok &= eq
        plans = a["plans"]
        fused = " | ".join(
            ",".join(f"[{r[0]},{r[1]}]" for r in plans[m]["fused_ranges"]) or "-"
            for m in ("target", "draft")
            if m in plans
        )
        draft = c["draft_hidden"] or "-"
        print(
            f"{c['target_hidden']:>5}/{draft!s:<6} {c['tp']:>2} {c['capability']:>3} "
            f"{c['max_num_batched_tokens']:>6} {c['backend']:>7} | "
            f"{fmt(b['cold_bytes']):>11} {fmt(b['warm_bytes']):>11} "
            f"{fmt(a['cold_bytes'])} {fmt(need)} {'yes' if eq else 'NO':>4} | {fused}"
        )
    print(
        "\nbefore cold/warm: first caller wins (cold: target pass first; warm: the "
        "target's fused op from the AOT cache).\nafter: same bytes in cold and warm "
        "order; '=min' compares it with FlashInfer's minimum for every admitted shape."
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
