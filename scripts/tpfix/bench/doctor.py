#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Wall time of one preflight (tpfix.preflight.doctor) on this machine, once the line's
trees exist: the seed-000 serve line (Qwen3-30B-A3B + Qwen3-4B drafter, TP 2,
8192 batched tokens, from tests/fixtures/models), as an operator runs it
(`python -m tpfix.preflight.doctor ...`, a fresh interpreter).  The first run builds
the trees if they are missing and is not counted.  Prints the median of
--runs (default 3); target 15 s, fails above 60 s.

    build/venv/bin/python scripts/tpfix/bench/doctor.py [--runs N] [--line TAG]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "fixtures" / "models"
LIMIT_S = 60
TARGET_S = 15  # issue 25: after the first run, on 2 cores


def serve_line() -> list[str]:
    draft = {"model": str(MODELS / "Qwen3-4B"), "num_speculative_tokens": 3}
    return [
        "--",
        "vllm",
        "serve",
        str(MODELS / "Qwen3-30B-A3B"),
        "--tensor-parallel-size",
        "2",
        "--speculative-config",
        json.dumps(draft),
        "--max-num-batched-tokens",
        "8192",
    ]


def run(line: str | None) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "tpfix.preflight.doctor", "--json"]
    cmd += ["--line", line] if line else []
    t = time.monotonic()
    proc = subprocess.run(cmd + serve_line(), capture_output=True, text=True)
    return time.monotonic() - t, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--line", default=None)
    args = ap.parse_args()
    warm, code = run(args.line)  # builds missing trees
    print(f"first run (trees built if missing): {warm:.1f} s, exit {code}")
    times = []
    for _ in range(args.runs):
        t, code = run(args.line)
        times.append(t)
        print(f"run: {t:.1f} s, exit {code}")
    load = os.getloadavg()[0]
    median = statistics.median(times)
    print(
        f"doctor, seed-000 line: median {median:.1f} s of {len(times)}, best {min(times):.1f} s "
        f"(target {TARGET_S} s, limit {LIMIT_S} s; {os.cpu_count()} CPUs, load {load:.1f})"
    )
    return 0 if median <= LIMIT_S else 1


if __name__ == "__main__":
    sys.exit(main())
