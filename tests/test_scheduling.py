# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""ci/test.sh runs the tests on pytest-xdist workers: a test file with a
module-scoped fixture must run on one worker (conftest.ONE_WORKER), or each
worker would make the fixture again (bug A's suites, the image, the rebase
report: minutes each)."""

from __future__ import annotations

import ast
from collections import OrderedDict
from pathlib import Path

from conftest import BUG_A_LINE, COST, ONE_WORKER, _Scheduling, scope_cost

from tpfix.core.lines import line_names

TESTS = Path(__file__).resolve().parent


def _module_fixtures(path: Path) -> list[str]:
    """Names of the fixtures `path` declares with scope="module" or "class"."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and any(
                k.arg == "scope" and getattr(k.value, "value", None) in ("module", "class")
                for k in dec.keywords
            ):
                out.append(node.name)
    return out


def test_every_file_with_a_module_fixture_runs_on_one_worker():
    found = {p.name: _module_fixtures(p) for p in sorted(TESTS.glob("test_*.py"))}
    spread = {name: fx for name, fx in found.items() if fx and name not in ONE_WORKER}
    assert not spread, f"add these files to ONE_WORKER in tests/conftest.py: {spread}"
    assert "test_bug_a.py" in found and found["test_bug_a.py"], "the scan finds nothing"
    assert set(ONE_WORKER) <= set(found), set(ONE_WORKER) - set(found)


def test_scopes():
    split = _Scheduling._split_scope
    bisect, bug_a = (
        split(None, f"tests/{f}::t[{BUG_A_LINE}]") for f in ("test_bisect.py", "test_bug_a.py")
    )
    assert bisect == bug_a  # the suites they share are computed once
    for tag in line_names():  # each line's bisect tests share its prefix trees' suites
        a, b = (split(None, f"tests/test_bisect.py::{t}[{tag}]") for t in ("a", "b"))
        assert a == b
        assert (a == bug_a) == (tag == BUG_A_LINE), tag
    assert split(None, "tests/test_image.py::a") == split(None, "tests/test_image.py::b")
    assert split(None, "tests/test_doctor.py::a") != split(None, "tests/test_doctor.py::b")


def test_costliest_scope_first():
    """The costliest unit of xdist's queue is handed out first (COST), the
    rest keep xdist's order; every COST entry names a scope or a test."""
    sched = _Scheduling.__new__(_Scheduling)
    sched.workqueue = OrderedDict((s, {}) for s in ("tests/test_a.py::t", "test_image.py", "x"))
    sent = []
    sched.assigned_work, sched.registered_collections = {}, {"node": []}

    class Node:
        def send_runtest_some(self, indexes):
            sent.append(indexes)

    node = Node()
    sched.registered_collections = {node: []}
    sched._assign_work_unit(node)
    assert list(sched.assigned_work[node]) == ["test_image.py"]
    assert list(sched.workqueue) == ["tests/test_a.py::t", "x"]
    assert scope_cost("tests/test_build.py::test_two_builds_are_byte_identical") > 0
    files = {p.name for p in TESTS.glob("test_*.py")}
    for key in COST:
        name = key.split("::")[0].split("[")[0]
        assert name in files or key in ONE_WORKER.values(), key
