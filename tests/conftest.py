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
from replays import source_line
from repo_copy import copy_repo
from xdist.scheduler import LoadScopeScheduling

from tpfix.core.lines import Line, get_line, line_names
from tpfix.replay.harness import keep_interpreters

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# Each test process keeps its scenario interpreters for the next scenario of
# the same tree: the preflight's replays, and bug A's single scenarios on the
# cache's trees, each in a fork of one that imported vLLM once
# (replay/harness.py: keep_interpreters, FORKED_MODULES).
keep_interpreters()


# The test files whose tests run on one xdist worker, and with which others:
# each file with a module-scoped fixture (made once for its tests, not once
# per worker; tests/test_scheduling.py checks every such file is here), and
# test_bug_a with test_bisect's tests of BUG_A_LINE (they read the same suite
# results, tests/replays.py; _Scheduling gives each other line's bisect a
# scope of its own).  Every other test is scheduled on its own.
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


# The line whose suites test_bug_a.py reads (bug A's patches were written on
# it): test_bisect.py's tests of that line share them, so they keep to bug A's
# worker; each other line's prefix trees are its bisect's alone, a scope of
# their own ("test_bisect.py[TAG]"), so that the lines' bisects can run on two
# workers at once.
BUG_A_LINE = source_line(get_line()).tag

# What a scope takes, in seconds (the slow tier on 2 cores, 2026-12-07; the
# scopes of a minute or more, by ONE_WORKER's name or as file::function for a
# test scheduled on its own).  CPU-bound as the run is, the order decides how
# long the end is where one worker still runs a long scope and the other has
# nothing left: the longest go first (longest processing time first), the
# short ones fill the end.  A scope not listed counts 0 and keeps xdist's
# order (the most tests first).  Only the order: every test runs as before.
COST = {
    "test_image_arches.py": 780,
    "test_upstream_port.py": 570,
    "test_doctor_deployments.py": 400,
    "test_image.py": 400,  # the default line's wheel (build1) is made here first
    "bug A's suites": 360,
    "test_start_line.py": 340,
    **{f"test_bisect.py[{tag}]": 290 for tag in line_names() if tag != BUG_A_LINE},
    "test_image_lines.py": 200,
    "test_bug_a_property.py": 170,
    "test_bug_b.py": 160,
    "test_build.py::test_two_builds_are_byte_identical": 150,
    "test_build.py::test_other_line_builds_are_byte_identical": 150,
    "test_upstream_tests.py::test_patch_tests_pass_with_the_patch": 40,
    "test_upstream_tests.py::test_patch_tests_fail_without_the_patch": 40,
    "test_installable.py::test_the_default_lines_wheel_installs_from_the_index": 60,
    "test_installable.py::test_each_other_lines_wheel_installs_from_the_index": 60,
    "test_upstream_export.py": 45,
    "test_bad_input.py::test_interrupted_build_leaves_dist_untouched": 40,
}


class _Scheduling(LoadScopeScheduling):
    """xdist's load-by-scope scheduling with the scopes of ONE_WORKER (xdist's
    own xdist_group marks do not group on pytest 9), the costliest scope
    (COST) handed out first."""

    def _split_scope(self, nodeid: str) -> str:
        name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        if name == "test_bisect.py" and nodeid.endswith("]"):
            tag = nodeid.rsplit("[", 1)[1][:-1]
            if tag != BUG_A_LINE:
                return f"{name}[{tag}]"
        return ONE_WORKER.get(name, nodeid)

    def _assign_work_unit(self, node) -> None:
        # xdist pops the first unit of its queue: bring the costliest there
        # (the first of equals: xdist's own order among them)
        first = max(self.workqueue, key=scope_cost)
        self.workqueue.move_to_end(first, last=False)
        super()._assign_work_unit(node)


def scope_cost(scope: str) -> int:
    """COST of a scope: its ONE_WORKER name, or a test's file::function."""
    if scope in COST:
        return COST[scope]
    return COST.get(scope.rsplit("/", 1)[-1].split("[", 1)[0], 0)


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
