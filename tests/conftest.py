# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""pytest set-up: share one real ./build.sh run per release line between the
tests that need a built wheel (tpfix itself is installed in build/venv), also
between pytest-xdist's workers, and tell xdist which tests to keep on one
worker (ci/test.sh runs each tier with -n auto)."""

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from repo_copy import copy_repo
from xdist.scheduler import LoadScopeScheduling

from tpfix.core.lines import Line, get_line, line_names

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


# The test files whose tests run on one xdist worker, and with which others:
# each file with a module-scoped fixture (made once for its tests, not once
# per worker; tests/test_scheduling.py checks every such file is here), and
# test_bug_a with test_bisect (they read the same suite results,
# tests/replays.py).  Every other test is scheduled on its own.
ONE_WORKER = {
    "test_bug_a.py": "bug A's suites",
    "test_bisect.py": "bug A's suites",
    "test_bug_a_property.py": "test_bug_a_property.py",
    "test_bug_b.py": "test_bug_b.py",
    "test_bug_c.py": "test_bug_c.py",
    "test_doctor_deployments.py": "test_doctor_deployments.py",
    "test_image.py": "test_image.py",
    "test_image_arches.py": "test_image_arches.py",
    "test_image_lines.py": "test_image_lines.py",
    "test_lock.py": "test_lock.py",
    "test_start_line.py": "test_start_line.py",
    "test_upstream_port.py": "test_upstream_port.py",
    "test_upstream_export.py": "test_upstream_export.py",
}


class _Scheduling(LoadScopeScheduling):
    """xdist's load-by-scope scheduling (largest scope first) with the scopes
    of ONE_WORKER (xdist's own xdist_group marks do not group on pytest 9)."""

    def _split_scope(self, nodeid: str) -> str:
        return ONE_WORKER.get(nodeid.split("::", 1)[0].rsplit("/", 1)[-1], nodeid)


def pytest_xdist_make_scheduler(config, log):
    return _Scheduling(config, log)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the repository's build inputs to break (tests/repo_copy.py)."""
    return copy_repo(tmp_path / "repo")


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


def once_per_run(tmp_path_factory, name: str, make: Callable[[Path], Path]) -> Path:
    """make(folder) once per test run, its result shared by every xdist
    worker: the first worker to ask makes it in the run's shared temporary
    folder while the others wait on a lock, then read where it is.  A make()
    that fails is tried again by the next worker that asks (and fails there
    too, with its own message)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder every worker's basetemp is in
    base, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(base, ignore_errors=True)  # what a failed make() left
            base.mkdir()
            done.write_text(str(make(base)))
        return Path(done.read_text())


@pytest.fixture(scope="session", params=line_names()[1:])  # every line but the default
def line_build(request, tmp_path_factory) -> tuple[Line, Path]:
    """(line, wheel) of one real ./build.sh --line TAG run per other release line
    (--no-cache: patched and built here, not an earlier build's wheel)."""
    wheel = once_per_run(
        tmp_path_factory,
        f"build-{request.param}",
        lambda base: run_build_sh(base / "dist", base / "work", request.param, "--no-cache"),
    )
    return get_line(request.param), wheel


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """The default line's wheel of one real ./build.sh run (--no-cache: built here)."""
    return once_per_run(
        tmp_path_factory,
        "build1",
        lambda base: run_build_sh(base / "dist", base / "work", None, "--no-cache"),
    )
