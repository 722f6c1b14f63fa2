# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The scenario interpreter (replay/harness.py: Interpreter, run_scenarios),
on small job modules instead of vLLM: the real runner in a real child
interpreter; only its environment is this test's (scenario_env, which puts a
vLLM tree and its FlashInfer on the path, is replaced by one that puts a
folder of job modules there), so these run in the fast tier.

What the preflight relies on: a job sent with fork=True changes nothing the
next job sees; the `ahead` jobs run first and their failures are dropped; an
exception is a result with the interpreter's stderr, the next job still runs;
an interpreter (or a fork) that dies is a clear error, not a hang; the
timeout covers all jobs together and kills the interpreter; a fork is refused
while Python threads run (a fork copies their locks).  And what the tests'
many preflights rely on (interpreter() once keep_interpreters ran): only an
interpreter whose jobs all ran in forks, none left under way, is kept, for
the same tree, start-up jobs and environment only, at most KEEP of them, a
dead one replaced, its stderr emptied; without keep_interpreters each is
closed after its block.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time

import pytest

from tpfix.replay import harness
from tpfix.replay.harness import Interpreter, interpreter, run_scenarios

JOBS = """
import os, threading, time

def setenv(name, value):
    os.environ[name] = value
    return {}

def getenv(name):
    return {"value": os.environ.get(name)}

def boom():
    raise ValueError("no such size")

def die(code):
    os._exit(code)

def sleep(seconds):
    time.sleep(seconds)
    return {}

def unserializable():
    return {"value": object()}

def pids():
    return {"pid": os.getpid(), "ppid": os.getppid()}

def start_thread():
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    return {}
"""


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A folder of job modules (package `hjobs`) and a scenario_env that
    puts it, and tpfix, on the path."""
    (tmp_path / "hjobs").mkdir()
    (tmp_path / "hjobs" / "__init__.py").write_text("")
    (tmp_path / "hjobs" / "jobs.py").write_text(textwrap.dedent(JOBS))

    def scenario_env(tree):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(harness.PACKAGE_ROOT)])
        return env

    monkeypatch.setattr(harness, "scenario_env", scenario_env)
    return tmp_path


def test_a_forked_job_leaves_nothing_behind(tree):
    with Interpreter(tree) as it:
        assert it.run("hjobs.jobs:setenv", fork=True, name="TPFIX_H", value="1") == {}
        assert it.run("hjobs.jobs:getenv", name="TPFIX_H") == {"value": None}
        assert it.run("hjobs.jobs:setenv", name="TPFIX_H", value="2") == {}
        assert it.run("hjobs.jobs:getenv", fork=True, name="TPFIX_H") == {"value": "2"}
        assert it.run("hjobs.jobs:getenv", name="TPFIX_H") == {"value": "2"}


def test_ahead_jobs_run_first_and_their_failures_are_dropped(tree):
    ahead = [
        ("hjobs.jobs:boom", {}),
        ("hjobs.jobs:setenv", {"name": "TPFIX_H", "value": "ahead"}),
        ("hjobs.nosuch:job", {}),
    ]
    with Interpreter(tree, ahead) as it:
        assert it.run("hjobs.jobs:getenv", name="TPFIX_H") == {"value": "ahead"}


def test_an_exception_is_a_result_and_the_next_job_runs(tree):
    results = run_scenarios(
        tree, [("hjobs.jobs:boom", {}), ("hjobs.jobs:getenv", {"name": "TPFIX_NONE"})]
    )
    assert results[0]["error"] == "ValueError"
    assert results[0]["message"] == "no such size"
    assert "ValueError: no such size" in results[0]["stderr"]
    assert results[1] == {"value": None}


def test_a_dying_fork_is_an_error_result_and_the_interpreter_goes_on(tree):
    with Interpreter(tree) as it:
        result = it.run("hjobs.jobs:die", fork=True, code=7)
        assert result["error"] == "Crashed"
        assert it.run("hjobs.jobs:getenv", name="TPFIX_NONE") == {"value": None}


def test_a_fork_whose_result_is_not_json_ends_there(tree):
    """The fork never runs on as a second interpreter reading the jobs."""
    with Interpreter(tree) as it:
        assert it.run("hjobs.jobs:unserializable", fork=True)["error"] == "Crashed"
        assert it.run("hjobs.jobs:setenv", name="TPFIX_H", value="1") == {}
        assert it.run("hjobs.jobs:getenv", name="TPFIX_H") == {"value": "1"}
        assert "TypeError" in it.stderr()


def test_a_dying_interpreter_is_a_clear_error(tree):
    with Interpreter(tree) as it:
        with pytest.raises(AssertionError, match=r"scenario hjobs.jobs:die crashed .*rc=5"):
            it.run("hjobs.jobs:die", code=5)
        # and so is every job after it (a closed pipe, not a hang)
        with pytest.raises(AssertionError, match="crashed"):
            it.run("hjobs.jobs:getenv", name="TPFIX_NONE")


def test_the_timeout_covers_all_jobs_and_kills_the_interpreter(tree):
    t0 = time.monotonic()
    with Interpreter(tree, timeout=3) as it:
        assert it.run("hjobs.jobs:sleep", seconds=1) == {}
        with pytest.raises(subprocess.TimeoutExpired):
            it.run("hjobs.jobs:sleep", seconds=30)  # 2 s of the 3 left
        assert it.proc.poll() is not None
    assert time.monotonic() - t0 < 20


def test_no_fork_while_python_threads_run(tree):
    with Interpreter(tree) as it:
        assert it.run("hjobs.jobs:start_thread") == {}
        result = it.run("hjobs.jobs:getenv", fork=True, name="TPFIX_NONE")
        assert result["error"] == "RuntimeError"
        assert "threads" in result["message"]
        assert it.run("hjobs.jobs:getenv", name="TPFIX_NONE") == {"value": None}


@pytest.fixture
def kept(monkeypatch):
    """A pool of its own for the test (keep_interpreters), closed after it."""
    pool: list = []
    monkeypatch.setattr(harness, "_KEPT", pool)
    yield pool
    for _, it in pool:
        it.close()


def test_without_keeping_each_interpreter_is_closed(tree, monkeypatch):
    monkeypatch.setattr(harness, "_KEPT", None)
    with interpreter(tree) as it:
        assert it.run("hjobs.jobs:getenv", fork=True, name="TPFIX_NONE") == {"value": None}
    assert it.proc.poll() is not None


def test_a_clean_interpreter_serves_the_next_block(tree, kept):
    with interpreter(tree) as first:
        assert first.run("hjobs.jobs:setenv", fork=True, name="TPFIX_H", value="1") == {}
        assert first.run("hjobs.jobs:boom", fork=True)["error"] == "ValueError"
    assert [it for _, it in kept] == [first] and first.proc.poll() is None
    with interpreter(tree) as again:
        assert again is first and again.stderr() == ""  # the earlier traceback is gone
        assert again.run("hjobs.jobs:getenv", name="TPFIX_H") == {"value": None}
    assert not kept and again.proc.poll() is not None  # an unforked job: closed


def test_a_job_left_under_way_is_not_kept(tree, kept, monkeypatch):
    with pytest.raises(KeyboardInterrupt), interpreter(tree) as it:

        def interrupted(timeout=None):
            raise KeyboardInterrupt

        monkeypatch.setattr(it._results, "get", interrupted)
        it.run("hjobs.jobs:sleep", fork=True, seconds=0)
    assert not kept and it.proc.poll() is not None


def test_another_start_or_environment_gets_another_interpreter(tree, kept, monkeypatch):
    with interpreter(tree) as plain:
        pass
    with interpreter(tree, [("hjobs.jobs:getenv", {"name": "X"})]) as ahead:
        assert ahead is not plain
    monkeypatch.setenv("TPFIX_OTHER", "1")
    with interpreter(tree) as other_env:
        assert other_env not in (plain, ahead)
    monkeypatch.delenv("TPFIX_OTHER")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test (call)")  # not part of the key
    with interpreter(tree) as same:
        assert same is plain


def test_a_dead_kept_interpreter_is_replaced_and_at_most_keep_are_kept(tree, kept, monkeypatch):
    monkeypatch.setattr(harness, "KEEP", 1)
    with interpreter(tree) as first:
        pass
    first.proc.kill()
    first.proc.wait()
    with interpreter(tree) as second:
        assert second is not first
        assert second.run("hjobs.jobs:getenv", fork=True, name="TPFIX_NONE") == {"value": None}
    with interpreter(tree, [("hjobs.jobs:getenv", {"name": "X"})]) as third:
        pass
    assert [it for _, it in kept] == [third] and second.proc.poll() is not None


def test_kept_forks_serve_the_forked_modules_scenarios_on_cached_trees(tree, kept, monkeypatch):
    """run_scenario of a FORKED_MODULES scenario on a tree of the cache, once
    interpreters are kept: each in a fork of one kept interpreter (what one
    sets up is gone for the next); elsewhere a fresh interpreter each; and a
    fresh one where the kept one cannot fork (threads)."""
    monkeypatch.setattr(harness, "FORKED_MODULES", ("hjobs.jobs",))
    monkeypatch.setattr(harness, "FORK_AHEAD", [])
    monkeypatch.setattr(harness, "_cached", lambda t: True)
    assert harness.run_scenario(tree, "hjobs.jobs:setenv", name="TPFIX_H", value="1") == {}
    assert harness.run_scenario(tree, "hjobs.jobs:getenv", name="TPFIX_H") == {"value": None}
    first, second = (harness.run_scenario(tree, "hjobs.jobs:pids") for _ in range(2))
    assert first["ppid"] == second["ppid"] != os.getpid() and first["pid"] != second["pid"]
    assert len(kept) == 1 and kept[0][1].proc.pid == first["ppid"]
    monkeypatch.setattr(harness, "_cached", lambda t: False)  # a tree that may change
    assert harness.run_scenario(tree, "hjobs.jobs:pids")["ppid"] == os.getpid()
    monkeypatch.setattr(harness, "_cached", lambda t: True)
    monkeypatch.setattr(harness, "FORK_AHEAD", [("hjobs.jobs:start_thread", {})])
    assert harness.run_scenario(tree, "hjobs.jobs:pids")["ppid"] == os.getpid()
