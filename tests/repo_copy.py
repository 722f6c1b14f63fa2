# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A copy of this repository's build inputs (scripts, pins, patches, ci,
VERSION, build.sh) to break on purpose, and its own tpfix run in it: the
`repo` fixture (tests/conftest.py) and the tests of bad input and of an
operator's mishaps (test_bad_input.py, test_ops.py) share them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tpfix.core.util import ROOT


def copy_repo(copy: Path) -> Path:
    copy.mkdir()
    for part in ("scripts", "pins", "patches", "ci"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("VERSION", "build.sh"):
        shutil.copy2(ROOT / f, copy / f)
    return copy


def run_in_copy(
    repo: Path, *args: str, env: dict | None = None, cache: Path | None = None
) -> subprocess.CompletedProcess:
    """Python ARGS in the copy, with the copy's own tpfix package (not this
    checkout's) and, given `cache`, that download cache."""
    e = dict(os.environ, PYTHONPATH=str(repo / "scripts"), **(env or {}))
    if cache is not None:
        e["VLLM_DIST_CACHE"] = str(cache)
    return subprocess.run(
        [sys.executable, *args], cwd=repo, env=e, text=True, capture_output=True, timeout=600
    )


def run_pipeline(
    repo: Path,
    dist: Path,
    work: Path | None,
    *args: str,
    env: dict | None = None,
    cache: Path | None = None,
) -> subprocess.CompletedProcess:
    """The copy's pipeline (what its build.sh runs) into `dist`, in `work`
    (None: its default work folder), with ARGS."""
    where = ["--dist", str(dist), *(["--workdir", str(work)] if work is not None else [])]
    return run_in_copy(repo, "-m", "tpfix.pipeline", *where, *args, env=env, cache=cache)
