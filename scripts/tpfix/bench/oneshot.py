#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug B: FlashInfer all-reduce workspace memory and one-shot/two-shot choice,
on pristine (+0001) and with the whole series, measured by running the real
code of two trees.

For the seed configuration (SM90, TP8, hidden 6144, bf16, 0.5 MiB budget) and
for TP2/TP4/TP8 at the default budgets of SM90 and SM100, and for both
FlashInfer backends, prints per tree:

* the workspace memory per rank that vLLM requests from FlashInfer (MNNVL: 3
  Lamport buffers; TRT-LLM: IPC buffer + flags + 3 Lamport buffers; MNNVL at
  allocation granularity 1, i.e. no allocator rounding);
* which strategy each token count gets as the tree ships (compressed into
  ranges), i.e. what reaches FlashInfer's kernel launch;
* "vLLM policy": token counts where the tree's own one-shot policy asks for
  more than the allocation (on trees that defer to FlashInfer on MNNVL, the
  policy is their table applied there, as before vllm#47589);
* for MNNVL, the memory the rejected alternative would take: a buffer sized
  for the one-shot range of vLLM's TRT-LLM table.

Everything comes from scripts/tpfix/bench/measure.py:bench_table (bug_b's
cases) run in a fresh interpreter per tree (see replay/device.py,
setup_recording, for what is simulated: GPU memory, kernel launches, the TP
group).  These configurations have one model width; no patch of the series
changes vLLM's one-shot table or FlashInfer's choice on MNNVL, so both trees
print the same here: what it shows is the strategy and memory of the series
for one width.

Usage:
    python -m tpfix.bench.oneshot [--tree-before DIR --tree-after DIR] \\
        [--hidden 6144] [--dtype bfloat16] [--max-num-batched-tokens 8192] [--json]
Trees default to pristine (+0001) and the whole series (scripts/tpfix/replay/harness.py);
any other tree works too, e.g. `python -m tpfix.stages.patch DEST --upto <patch>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.replay.harness import run_scenario, tree_after, tree_before

PATCH = "0002-standalone-allreduce-asks-the-workspace.patch"  # pristine + 0001 before it


def configs(hidden: int, dtype: str, limit: int) -> list[dict]:
    base = {"widths": [hidden], "dtype": dtype, "limit": limit}
    out = [{"name": "seed", "capability": 90, "tp": 8, "budget_mb": 0.5, **base}]
    for cap in (90, 100):
        for tp in (2, 4, 8):
            out.append(
                {"name": f"SM{cap} TP{tp}", "capability": cap, "tp": tp, "budget_mb": None, **base}
            )
    return out


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def ranges(rs: list[list[int]] | None) -> str:
    if not rs:
        return "none"
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in rs)


def strategy_text(row: dict) -> str:
    if row.get("fusion") == "unsupported":
        return "fusion unsupported"
    (h,) = {str(w) for w in row["oneshot_tokens"]} | set()
    return f"1shot {ranges(row['oneshot_tokens'][h])} | 2shot {ranges(row['twoshot_tokens'][h])}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree-before", type=Path, help="vLLM tree without the patch")
    ap.add_argument("--tree-after", type=Path, help="vLLM tree with the patch")
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--json", action="store_true", help="print raw rows")
    args = ap.parse_args()

    cfgs = configs(args.hidden, args.dtype, args.max_num_batched_tokens)
    scen = [{k: v for k, v in c.items() if k != "name"} for c in cfgs]
    result = {}
    trees = {
        "before": args.tree_before or tree_before(PATCH),
        "after": args.tree_after or tree_after(read_series(get_line().series)[-1]),
    }
    for label, tree in trees.items():
        rows = run_scenario(tree, "tpfix.bench.measure:bench_table", configs=scen)
        if isinstance(rows, dict) and "error" in rows:
            sys.exit(
                f"{label} tree {tree}: {rows['error']}: {rows['message']}\n{rows.get('stderr', '')}"
            )
        result[label] = rows
    if args.json:
        print(json.dumps(result, indent=1))
        return

    print(
        f"hidden {args.hidden}, {args.dtype}, max_num_batched_tokens "
        f"{args.max_num_batched_tokens}; memory in MiB per rank"
    )
    names = [c["name"] for c in cfgs for _ in ("mnnvl", "trtllm")]
    for name, before, after in zip(names, result["before"], result["after"], strict=True):
        assert (before["backend"], before["tp"]) == (after["backend"], after["tp"])
        budget = "default" if before["budget_mb"] is None else before["budget_mb"]
        m = before.get("max_token_num") or {}
        print(
            f"\n{name} [{before['backend']}] budget={budget} MiB "
            f"max_token_num={max(m.values()) if m else '-'}"
        )
        for label, row in (("before", before), ("after", after)):
            extra = ""
            if row["backend"] == "mnnvl":
                extra = f" buffer={row.get('mnnvl_buffer_size_bytes')} B"
            print(
                f"  {label:6} mem={mib(row.get('workspace_bytes_per_rank'))}"
                f"{extra}  {strategy_text(row)}"
            )
            print(
                f"         vLLM policy over allocation: "
                f"{row.get('policy_failures')} token counts "
                f"({ranges(row.get('policy_failure_tokens'))})"
            )
        if "alt_vllm_table_bytes_per_rank" in after:
            delta = after["alt_vllm_table_bytes_per_rank"] - after["workspace_bytes_per_rank"]
            print(
                f"  rejected: MNNVL sized for vLLM's TRT-LLM table (1shot up to "
                f"{after['alt_vllm_table_oneshot_tokens']} tokens): "
                f"mem={mib(after['alt_vllm_table_bytes_per_rank'])} "
                f"(+{mib(delta)})"
            )


if __name__ == "__main__":
    main()
