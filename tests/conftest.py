# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""pytest set-up: share one real ./build.sh run per release line between the
tests that need a built wheel (tpfix itself is installed in build/venv)."""

import subprocess
from pathlib import Path

import pytest

from tpfix.lines import Line, get_line, line_names

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def run_build_sh(dist: Path, work: Path, line: str | None = None, *args: str) -> Path:
    """./build.sh as a user runs it (with `args`), into `dist`; returns the one wheel there."""
    proc = subprocess.run(
        [str(ROOT / "build.sh"), "--dist", str(dist), "--workdir", str(work), *args]
        + (["--line", line] if line else []),
        text=True,
        capture_output=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="session", params=line_names()[1:])  # every line but the default
def line_build(request, tmp_path_factory) -> tuple[Line, Path]:
    """(line, wheel) of one real ./build.sh --line TAG run per other release line
    (--no-cache: patched and built here, not an earlier build's wheel)."""
    base = tmp_path_factory.mktemp(f"build-{request.param}")
    wheel = run_build_sh(base / "dist", base / "work", request.param, "--no-cache")
    return get_line(request.param), wheel


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """The default line's wheel of one real ./build.sh run (--no-cache: built here)."""
    base = tmp_path_factory.mktemp("build1")
    return run_build_sh(base / "dist", base / "work", None, "--no-cache")
