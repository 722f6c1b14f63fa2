#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Sweep of the FlashInfer all-reduce workspace over >= 10,000 deployments,
v0.27.1 (+0001, the tree before the first fix) against the patched series, one run.

Each configuration (target/draft hidden sizes of real models, TP 2/4/8,
SM 90/100/103, backend trtllm/mnnvl, max_num_batched_tokens 16..16384,
standalone FlashInfer all-reduce off/on) runs in cold and warm creation
order through the REAL vLLM code of each tree and FlashInfer's own
validators (scripts/tpfix/bench/measure.py:sweep; the device layer is simulated
as that module says).  Printed per tree: configurations that crash (some
request the engine makes does not fit the workspace it gets, or start-up
raises), the largest fused token count of every model, and the workspace
bytes per rank against FlashInfer's minimum (the smallest workspace, as
wide as the widest model, that holds every model's requests up to its own
fused range, found with FlashInfer's validators).

    build/venv/bin/python -m tpfix.bench.sweep_workspace [--limit N]

This is a measurement, not a test: it prints numbers, it asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PATCH = "0002-standalone-allreduce-asks-the-workspace.patch"  # pristine + 0001 before it

# hidden_size of real models (config.json)
TARGETS = {
    "Qwen3-30B-A3B": 2048,
    "Qwen3-8B": 4096,
    "Qwen3-14B": 5120,
    "Qwen3-32B": 5120,
    "Qwen3-235B-A22B": 4096,
    "Llama-3.1-8B": 4096,
    "Llama-3.1-70B": 8192,
    "Llama-3.3-70B": 8192,
    "Llama-3.1-405B": 16384,
    "DeepSeek-V3": 7168,
    "gpt-oss-120b": 2880,
    "GLM-4.5-Air": 4096,
    "GLM-4.5": 5120,
    "GLM-5.2": 6144,
    "Mistral-Large-2": 12288,
}
DRAFTS = {
    "Qwen3-0.6B": 1024,
    "Qwen3-1.7B": 2048,
    "Qwen3-4B": 2560,
    "Qwen3-8B": 4096,
    "Llama-3.2-1B": 2048,
    "Llama-3.2-3B": 3072,
    "Llama-3.1-8B": 4096,
    "gpt-oss-20b": 2880,
}
FAMILIES = ("Qwen3", "Llama", "gpt-oss")


def pairs() -> list[tuple[str, int, str | None, int | None]]:
    """Each target alone, with an EAGLE/MTP head (its own width) and with every
    draft model of its family (any width)."""
    out = []
    for t, th in TARGETS.items():
        out += [(t, th, None, None), (t, th, "eagle", th)]
        fam = next((f for f in FAMILIES if t.startswith(f)), None)
        out += [(t, th, d, dh) for d, dh in DRAFTS.items() if fam and d.startswith(fam) and d != t]
    return out


def configs() -> list[dict]:
    grid = itertools.product(
        pairs(),
        (2, 4, 8),
        (90, 100, 103),
        (16, 128, 1024, 2048, 8192, 16384),
        ("trtllm", "mnnvl"),
        (False, True),
    )
    return [
        dict(
            target=th,
            draft=dh,
            tp=tp,
            capability=sm,
            tokens=n,
            backend=be,
            standalone=sa,
            names=[t, d],
        )
        for (t, th, d, dh), tp, sm, n, be, sa in grid
    ]


def run(tree: Path, cfgs: list[dict], chunk: int = 400) -> list[dict]:
    from tpfix.replay.harness import run_scenario

    rows: list[dict] = []
    for i in range(0, len(cfgs), chunk):
        res = run_scenario(
            tree, "tpfix.bench.measure:sweep", timeout=3600, configs=cfgs[i : i + chunk]
        )
        if isinstance(res, dict):
            raise SystemExit(f"sweep failed in {tree}: {res}")
        rows += res
    return rows


def summary(rows: list[dict]) -> dict:
    crash = {o: sum(r[o]["crash"] for r in rows) for o in ("cold", "warm")}
    crash["any"] = sum(r["cold"]["crash"] or r["warm"]["crash"] for r in rows)
    narrower = sum(
        (r["cold"]["crash"] or r["warm"]["crash"])
        and r["config"]["draft"] is not None
        and r["config"]["draft"] < r["config"]["target"]
        for r in rows
    )
    return {"crash": crash, "crash_narrower_draft": narrower}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N configurations")
    args = ap.parse_args()
    from tpfix.core.lines import get_line
    from tpfix.core.patch_format import read_series
    from tpfix.replay.harness import tree_after, tree_before

    cfgs = configs()[: args.limit]
    trees = {
        "v0.27.1": tree_before(PATCH),
        "patched": tree_after(read_series(get_line().series)[-1]),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futs = {k: pool.submit(run, t, cfgs) for k, t in trees.items()}
        res = {k: f.result() for k, f in futs.items()}
    before, after = res["v0.27.1"], res["patched"]
    print(
        f"{len(cfgs)} configurations ({len(pairs())} target/draft pairs x TP 2/4/8 x "
        "SM 90/100/103 x 6 token limits x trtllm/mnnvl x standalone off/on), "
        "each in cold and warm order"
    )
    for name, rows in res.items():
        s = summary(rows)
        print(
            f"  {name:8} crashing configurations: {s['crash']['any']} "
            f"(cold {s['crash']['cold']}, warm {s['crash']['warm']}; with a draft "
            f"narrower than the target: {s['crash_narrower_draft']})"
        )
    lost = gained = same = 0
    for b, a in zip(before, after, strict=True):
        for model, top in b["fused_top"].items():
            t = a["fused_top"][model]
            lost += t < top
            gained += t > top
            same += t == top
    print(
        f"  fused range per model (largest fused token count), patched vs v0.27.1: "
        f"{same} same, {lost} smaller, {gained} larger"
    )
    pairs_ = list(zip(before, after, strict=True))
    is_mixed = [a["config"]["draft"] not in (None, a["config"]["target"]) for _, a in pairs_]
    mixed = [p for p, m in zip(pairs_, is_mixed, strict=True) if m]
    single = [p for p, m in zip(pairs_, is_mixed, strict=True) if not m]
    same = sum(a["cold"]["bytes"] == b["cold"]["bytes"] for b, a in single)
    print(f"  one width in the TP group: patched bytes == v0.27.1 bytes in {same}/{len(single)}")
    for backend in ("trtllm", "mnnvl"):
        excess: Counter = Counter()
        worst: tuple[float, dict | None] = (0.0, None)
        pcts = []
        for b, a in mixed:
            m, got = a["min_bytes"], a["cold"]["bytes"]
            if a["config"]["backend"] != backend:
                continue
            if m is None:
                excess["no fusion"] += 1
                continue
            pct = 100.0 * (got - m) / m
            pcts.append(pct)
            excess["= minimum" if got == m else ("above" if got > m else "below")] += 1
            excess["above, as much as v0.27.1"] += got > m and got == b["cold"]["bytes"]
            worst = max(worst, (pct, a["config"]), key=lambda x: x[0])
        pcts.sort()
        print(
            f"  mixed widths, {backend}: patched bytes per rank vs FlashInfer's minimum: "
            f"{dict(excess)}; excess median {pcts[len(pcts) // 2] if pcts else 0:.2f}%, "
            f"max {worst[0]:.2f}%{f' at {worst[1]}' if worst[1] else ''}"
        )
    grew = [a["cold"]["bytes"] - b["cold"]["bytes"] for b, a in zip(before, after, strict=True)]
    print(
        f"  patched minus v0.27.1 bytes per rank (cold order): "
        f"{sum(g > 0 for g in grew)} larger, {sum(g == 0 for g in grew)} equal, "
        f"{sum(g < 0 for g in grew)} smaller; max +{max(grew) / 2**20:.2f} MiB"
    )
    for name, rows in res.items():
        bad = [r for r in rows if r["cold"]["crash"] or r["warm"]["crash"]][:3]
        for r in bad:
            print(f"  e.g. {name}: {r['config']} cold {r['cold']['bad']} warm {r['warm']['bad']}")


if __name__ == "__main__":
    main()
