#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Each model's fused all-reduce range with a draft of another width, on the
pristine tag of a release line and with its series, side by side in one run.

For each (target, draft, method) of real model widths, TP 2/4/8 and SM90 /
SM100 (trtllm, the default budgets, max_num_batched_tokens 8192) it runs
tpfix/replay/bug_a_budget.py:fused_ranges (a cold start: the REAL vLLM config,
compile ranges, AllReduceFusionPass of each model and the fused op, on the
device layer tpfix/replay/device.py simulates) in one interpreter per tree,
and prints a markdown table: the largest token count each model fuses
(stock | patched), each model's own limit (the fusion budget at its width),
and the workspace bytes per rank of each tree.  Rows where stock and patched
agree are left out unless --all.

    build/venv/bin/python -m tpfix.bench.fused_ranges [--line v0.33.0] [--all]
"""

from __future__ import annotations

import argparse

from tpfix.core.lines import get_line, newest_line
from tpfix.core.patch_format import read_series
from tpfix.replay.harness import run_scenarios
from tpfix.stages.patch import cached_tree

MiB = 1024 * 1024
PAIRS = [
    # (label, target width, draft width, method)
    ("Qwen3-30B-A3B + Qwen3-4B", 2048, 2560, "draft_model"),
    ("Qwen3-30B-A3B + Qwen3-8B", 2048, 4096, "draft_model"),
    ("Qwen3-4B + Qwen3-8B", 2560, 4096, "draft_model"),
    ("Qwen3-32B + Qwen3-8B", 5120, 4096, "draft_model"),
    ("Qwen3-32B + Qwen3-0.6B", 5120, 1024, "draft_model"),
    ("2048-wide target + 2560-wide EAGLE-3 head", 2048, 2560, "eagle3"),
]
LAYOUTS = [(tp, cap) for cap in (90, 100) for tp in (2, 4, 8)]


def _cell(res: dict, model: str) -> str:
    if "error" in res:
        return "crash"
    return str(res["models"][model]["fused_up_to"])


def _mib(res: dict) -> str:
    ws = (res.get("workspace") or {}) if "error" not in res else {}
    return f"{ws['bytes'] / MiB:.0f}" if ws.get("bytes") else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--line", default=newest_line(), help="release line (default: the newest)")
    ap.add_argument("--all", action="store_true", help="also the rows where both agree")
    args = ap.parse_args()
    line = get_line(args.line)
    trees = {
        "stock": cached_tree(line, upto=""),
        "patched": cached_tree(line, upto=read_series(line.series)[-1]),
    }
    cases = [
        (label, dict(target_hidden=t, draft_hidden=d, spec_method=m, tp=tp, capability=cap))
        for label, t, d, m in PAIRS
        for tp, cap in LAYOUTS
    ]
    jobs = [("bug_a:fused_ranges", kwargs) for _, kwargs in cases]
    results = {k: run_scenarios(tree, jobs, timeout=3000) for k, tree in trees.items()}
    print(f"{line.tag}: tokens each model fuses (stock | patched) and the workspace per rank")
    print()
    print(
        "| target + draft | TP | SM | target limit | target fused | draft limit "
        "| draft fused | workspace MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, (label, kw) in enumerate(cases):
        stock, patched = results["stock"][i], results["patched"][i]
        row = [_cell(r, m) for m in ("target", "draft") for r in (stock, patched)]
        if row[0] == row[1] and row[2] == row[3] and not args.all:
            continue
        ok = patched if "error" not in patched else stock
        limits = [
            str(ok["models"][m]["own_limit"]) if "models" in ok else "?"
            for m in ("target", "draft")
        ]
        print(
            f"| {label} | {kw['tp']} | {kw['capability']} | {limits[0]} | {row[0]} \\| {row[1]} "
            f"| {limits[1]} | {row[2]} \\| {row[3]} | {_mib(stock)} \\| {_mib(patched)} |"
        )


if __name__ == "__main__":
    main()
