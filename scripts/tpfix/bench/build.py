# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Benchmark the build against the upstream path, side by side, in one run.

Prints: the upstream path (pip download of the official wheel, no cache) next
to our cold build (empty download cache, no pip cache), our warm build
(downloads cached, --no-cache) and a rebuild with nothing changed (the
built-wheel cache, tpfix.stages.wheel_cache); wheel sizes; and the peak disk space the build used
(cache + work tree + staging + dist, sampled every 0.2 s).

    build/venv/bin/python -m tpfix.bench.build
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tpfix.core.lines import get_line, wheel_pin
from tpfix.core.util import host_arch


def _du(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        for dirpath, _, files in os.walk(p):
            for f in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def _timed(cmd: list[str], env: dict, watch: list[Path]) -> tuple[float, int]:
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _du(watch))
            time.sleep(0.2)

    t = threading.Thread(target=sample)
    t.start()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
    elapsed = time.monotonic() - t0
    done.set()
    t.join()
    if proc.returncode != 0:
        sys.exit(f"benchmark command failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return elapsed, max(peak, _du(watch))


def main() -> None:
    arch = host_arch()
    with (
        tempfile.TemporaryDirectory(prefix="bench.") as tmp,
        tempfile.TemporaryDirectory(prefix="bench-upstream.") as up_tmp,
    ):
        t, up = Path(tmp), Path(up_tmp)
        cache, work, dist = t / "cache", t / "work", t / "dist"
        env = dict(os.environ, VLLM_DIST_CACHE=str(cache), PIP_NO_CACHE_DIR="1")
        pin = wheel_pin(arch, get_line().tag)
        up_s, _ = _timed(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--platform",
                pin.platform,
                "--python-version",
                "3.12",
                f"vllm=={pin.version}",
                "-d",
                str(up),
            ],
            env,
            [up],
        )
        build = [
            sys.executable,
            "-m",
            "tpfix.pipeline",
            "--dist",
            str(dist),
            "--workdir",
            str(work),
        ]
        watch = [t]  # cache, work tree, staging folder and dist all live here
        cold_s, cold_peak = _timed(build, env, watch)
        warm_s, warm_peak = _timed([*build, "--no-cache"], env, watch)
        again_s, again_peak = _timed(build, env, watch)
        ours = next(dist.glob("*.whl"))
        official = up / pin.filename
        rows = [
            ("upstream: pip download official wheel", f"{up_s:7.1f} s", "", ""),
            (
                "ours: cold build (empty cache)",
                f"{cold_s:7.1f} s",
                "",
                f"{cold_peak / 2**20:8.0f} MiB",
            ),
            (
                "ours: warm build (downloads cached, --no-cache)",
                f"{warm_s:7.1f} s",
                "",
                f"{warm_peak / 2**20:8.0f} MiB",
            ),
            (
                "ours: rebuild, nothing changed (wheel cached)",
                f"{again_s:7.1f} s",
                "",
                f"{again_peak / 2**20:8.0f} MiB",
            ),
            ("official wheel size", "", f"{official.stat().st_size:,} B", ""),
            ("our wheel size", "", f"{ours.stat().st_size:,} B", ""),
        ]
        print(f"{'':48} {'time':>9} {'size':>16} {'peak disk':>12}")
        for name, a, b, c in rows:
            print(f"{name:48} {a:>9} {b:>16} {c:>12}")
        delta = ours.stat().st_size - official.stat().st_size
        print(f"size difference: {delta:+,} bytes ({ours.name})")
        print("peak disk: download cache + work tree + staging + dist of our build")


if __name__ == "__main__":
    main()
