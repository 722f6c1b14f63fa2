# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Trees of the series and a runner that executes real vLLM code inside them.

`tree_before(p)` / `tree_after(p)` are the default line's pristine tag plus its series up to
but excluding / including patch `p` (cached by content under
<cache>/trees).  `run_scenario(tree, "module:function", **kw)` runs
tpfix/replay/<module>.py's function (a dotted module, e.g.
"tpfix.bench.measure:bench", is imported as named) in a fresh interpreter whose imports of
`vllm` come from `tree` and whose FlashInfer is the release that tree pins in
requirements/cuda.txt, and returns what the function returned (a JSON dict);
an uncaught exception comes back as {"error": type name, "message": str}.
`Interpreter(tree)` is such an interpreter kept for several jobs, sent one
at a time, each optionally in a fork (the preflight's replays);
`interpreter(tree)` hands one out for a block, or, once a process has asked
for it (keep_interpreters: the tests), one an earlier block left as it started;
there run_scenario runs bug A's scenarios on the cache's trees in forks of one
(FORKED_MODULES) instead of a fresh interpreter each.

A patch names the scenarios that show its fix in its header (patch_format):

    Scenario: bug_b:run_case(**NARROW_DRAFT)
     what the scenario shows when the patch works (folded lines)

`module:function` of tpfix/replay, optionally with keyword arguments given
by the name of a dict constant of that module, then the words the rebase
report and the pull request print.  `patch_checks(patchfile)` turns those
fields into `Check`s: the verdict on a result is the module's
`check_<function>` (replay.verdict); `run_check(tree, check)` runs one.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpfix.core.lines import LINES, Line, get_line, read_pin_file
from tpfix.core.patch_format import read_patch, read_series
from tpfix.core.util import Fail, cache_dir, cache_lock
from tpfix.stages.fetch import fetch_test_dep, pinned_test_dep
from tpfix.stages.patch import cached_tree

# The folder that holds the tpfix package: scenario interpreters import the
# replays (tpfix.replay.<module>) and the CPU stand-ins from it.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def tree_after(patch: str, line: Line | None = None) -> Path:
    """The tree of `line`'s series up to and with `patch` (default line: the
    top-level VERSION's)."""
    return cached_tree(line or get_line(), upto=patch)


def tree_before(patch: str, line: Line | None = None) -> Path:
    """The tree of `line`'s series up to `patch`, without it."""
    line = line or get_line()
    names = read_series(line.series)
    i = names.index(patch)
    return cached_tree(line, upto=names[i - 1] if i else "")


def pinned_flashinfer(tree: Path) -> str:
    """The FlashInfer a tree replays with: the one its requirements/cuda.txt
    pins, or, where that release has no test pin because the package index
    does not serve it, the re-pin of the line that re-pins it (pins.toml
    `flashinfer` = it, `flashinfer-repinned`: tpfix.maint.start_line --repin),
    which is what that line's wheel runs with."""
    text = (tree / "requirements" / "cuda.txt").read_text()
    m = re.search(r"^flashinfer-python==(\S+)", text, re.M)
    assert m, f"{tree}: requirements/cuda.txt pins no flashinfer-python"
    version = m.group(1)
    if pinned_test_dep("flashinfer-python", version) is None:
        for pins in sorted(LINES.glob("*/pins.toml")):
            data = read_pin_file(pins)
            if data.get("flashinfer") == version and data.get("flashinfer-repinned"):
                return data["flashinfer-repinned"]
    return version


def flashinfer_site(version: str) -> Path:
    """flashinfer-python==version unpacked from its pinned, verified wheel."""
    dest = cache_dir() / "site" / f"flashinfer-python-{version}"
    with cache_lock(dest.name):
        if not dest.exists():
            wheel = fetch_test_dep("flashinfer-python", version)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".fi.", dir=dest.parent))
            with zipfile.ZipFile(wheel) as z:
                z.extractall(tmp)
            os.replace(tmp, dest)
    return dest


def scenario_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [tree, flashinfer_site(pinned_flashinfer(tree)), PACKAGE_ROOT]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # Trees are shared, keep them clean: their bytecode goes to the cache
    # (each interpreter compiled vLLM's ~900 modules again, ~2 s, without it).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache_dir() / "pycache")
    # vLLM's own cache (VLLM_CACHE_ROOT: its model-info cache, one file per
    # model class, checked by the model module's hash), one per vLLM release
    # in ours: in the user's ~/.cache/vllm the trees of two releases evicted
    # each other's entries, and each miss inspects the class in a subprocess
    # that imports vLLM again (13 s of a 50 s deployment replay, measured).
    env["VLLM_CACHE_ROOT"] = str(cache_dir() / "vllm" / _release(tree))
    return env


def _release(tree: Path) -> str:
    """The vLLM release of a tree (its sdist's PKG-INFO), else the tree's name."""
    with contextlib.suppress(OSError):
        for line in (tree / "PKG-INFO").read_text().splitlines():
            if line.startswith("Version: "):
                return line.removeprefix("Version: ").strip()
    return tree.name


# The interpreter of run_scenarios and Interpreter: it runs the `ahead` jobs
# (argv[2]), then each job read from stdin (one JSON line), and writes each
# result as one JSON line to the pipe whose descriptor is argv[1].  A job sent
# with fork=True runs in a fork of the interpreter, so what it sets up dies
# with the fork (refused where Python threads run: a fork copies their locks).
# It does not import rfc3987_syntax: an optional IRI format checker of
# jsonschema (which mistral_common's import pulls in) whose grammar, compiled
# at import, was a fifth of every scenario interpreter's start-up; no
# scenario validates an IRI.
_RUNNER = """
import importlib, json, os, sys, threading, traceback
sys.modules.setdefault("rfc3987_syntax", None)  # jsonschema skips its IRI check
def call(mod, fn, kwargs):
    mod = mod if "." in mod else "tpfix.replay." + mod
    return getattr(importlib.import_module(mod), fn)(**kwargs)
def run(mod, fn, kwargs):
    try:
        return call(mod, fn, kwargs)
    except BaseException as e:
        traceback.print_exc()
        return {"error": type(e).__name__, "message": str(e)}
def forked(mod, fn, kwargs):
    if threading.active_count() > 1:
        return {"error": "RuntimeError", "message": "no fork: Python threads run"}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # never back into the loop below, whatever happens here
        try:
            os.close(r)
            text = json.dumps(run(mod, fn, kwargs))
            with os.fdopen(w, "w") as f:
                f.write(text + "\\n")
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.readline()  # not to EOF: a process the job left may hold the pipe
    _, status = os.waitpid(pid, 0)
    return json.loads(text) if text else {"error": "Crashed", "message": f"fork: {status}"}
out = os.fdopen(int(sys.argv[1]), "w")
for job in json.loads(sys.argv[2]):  # while the caller works out its jobs
    try:
        call(*job)
    except BaseException:
        pass  # the job that needs it reports the failure
for line in sys.stdin:
    mod, fn, kwargs, fork = json.loads(line)
    out.write(json.dumps((forked if fork else run)(mod, fn, kwargs)) + "\\n")
    out.flush()
"""


# Scenario modules whose scenarios all start with device.setup(): once a
# process keeps interpreters (keep_interpreters), each runs in a fork of one
# that imported vLLM's host modules ahead (device.import_host_modules, as a
# fresh interpreter's setup() does first), on a tree of the cache (its
# content never changes under a path), instead of importing vLLM again.
FORKED_MODULES = ("bug_a",)
FORK_AHEAD = [("device:import_host_modules", {})]
_NO_FORK = "no fork: Python threads run"


def run_scenario(tree: Path, spec: str, timeout: float = 900, **kwargs) -> dict:
    """``spec`` ("module:function") with ``kwargs`` in a fresh interpreter on
    ``tree`` (or a fork of a kept one: FORKED_MODULES): what it returned, or
    {"error", "message", "stderr"}."""
    if _KEPT is not None and spec.split(":")[0] in FORKED_MODULES and _cached(tree):
        with interpreter(tree, FORK_AHEAD, timeout) as it:
            result = it.run(spec, fork=True, **kwargs)
        if not (isinstance(result, dict) and result.get("message") == _NO_FORK):
            return result
    return run_scenarios(tree, [(spec, kwargs)], timeout=timeout)[0]


def _cached(tree: Path) -> bool:
    """A tree of the cache (stages.patch.cached_tree): its content is its key."""
    return (cache_dir() / "trees") in Path(tree).resolve().parents


def run_scenarios(tree: Path, jobs: list[tuple[str, dict]], timeout: float = 900) -> list:
    """Each (spec, kwargs) of ``jobs``, in order, in ONE fresh interpreter on
    ``tree`` (one start-up instead of one each): their results, as
    run_scenario returns them.  Only for scenarios that may follow one
    another in a process (those of one module that reset what they set up,
    such as bug_b's cases); an exception is reported and the next job runs."""
    with Interpreter(tree, timeout=timeout) as interpreter:
        return [interpreter.run(spec, **kwargs) for spec, kwargs in jobs]


class Interpreter:
    """A fresh interpreter on ``tree``, started now, that runs scenarios one
    after another as they are sent (``run``).  It first runs the ``ahead``
    scenarios (imports, say; results and errors dropped) while the caller
    works out its jobs.  ``timeout``: seconds for all its jobs together.
    Killed on ``close`` (leaving the ``with``) if it still runs."""

    def __init__(self, tree: Path, ahead: Sequence[tuple[str, dict]] = (), timeout=900.0):
        self.tree, self.timeout, self.deadline = tree, timeout, time.monotonic() + timeout
        self.clean = True  # no job ran here but in a fork: its state is its start-up's
        env = scenario_env(tree)
        # One torch thread: the tests run several scenario interpreters at
        # once (more than the cores), where idle OpenMP threads spinning cost
        # more than they give (a scenario's results do not depend on the
        # thread count: its reference and its simulated kernel are computed
        # alike in one process).
        env.setdefault("OMP_NUM_THREADS", "1")
        self._tmp = tempfile.TemporaryDirectory()
        # appended (O_APPEND): interpreter() empties it for each preflight
        self._stderr = open(Path(self._tmp.name) / "stderr", "a+")  # noqa: SIM115
        read, write = os.pipe()
        ahead_payload = json.dumps([[*spec.split(":"), kw] for spec, kw in ahead])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _RUNNER, str(write), ahead_payload],
            env=env,
            cwd=self._tmp.name,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            pass_fds=(write,),
        )
        os.close(write)
        self._results: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(read,), daemon=True).start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd) as results:
            for line in results:
                self._results.put(line)
        self._results.put("")  # the interpreter has gone

    def run(self, spec: str, fork: bool = False, **kwargs) -> dict:
        """What ``spec`` returned, or {"error", "message", "stderr"}.  With
        ``fork``, it runs in a fork of the interpreter: what it changes (the
        environment, patched vLLM functions) is gone for the next job."""
        mod, fn = spec.split(":")
        clean, self.clean = self.clean and fork, False  # until its result is read
        try:
            self.proc.stdin.write(json.dumps([mod, fn, kwargs, fork]) + "\n")
            self.proc.stdin.flush()
            line = self._results.get(timeout=max(0.0, self.deadline - time.monotonic()))
        except BrokenPipeError:  # it has gone already
            line = ""
        except queue.Empty:
            self.close()
            raise subprocess.TimeoutExpired(self.proc.args, self.timeout) from None
        if not line:
            rc = self.proc.wait()
            raise AssertionError(
                f"scenario {spec} crashed in {self.tree} (rc={rc}):\n{self.stderr()}"
            )
        self.clean = clean
        result = json.loads(line)
        if isinstance(result, dict) and "error" in result:
            result.setdefault("stderr", self.stderr())
        return result

    def stderr(self) -> str:
        """The last 4,000 characters the interpreter wrote to stderr."""
        self._stderr.flush()
        return Path(self._stderr.name).read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        self._stderr.close()
        self._tmp.cleanup()

    def __enter__(self) -> Interpreter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Interpreters kept for the next interpreter() of the same tree, start-up jobs
# and environment (keep_interpreters), least recently used first; None: each
# is closed after its block.  At most KEEP (each holds vLLM and torch imported,
# about half a GB).
_KEPT: list[tuple[tuple, Interpreter]] | None = None
KEEP = 4
# What pytest sets for each test, which no scenario reads: not part of the key.
_PER_TEST_ENV = ("PYTEST_CURRENT_TEST",)


def keep_interpreters() -> None:
    """From now on in this process, an interpreter() whose jobs all ran in
    forks (its state is its start-up's, imports included) is kept when its
    block ends, and the next interpreter() of the same tree, start-up jobs
    and environment gets it instead of starting one: for a process that runs
    the preflight many times (the tests); the kept ones die with the process."""
    global _KEPT
    if _KEPT is None:
        _KEPT = []
        atexit.register(lambda: [it.close() for _, it in _KEPT])


@contextlib.contextmanager
def interpreter(tree: Path, ahead: Sequence[tuple[str, dict]] = (), timeout=900.0):
    """Interpreter(tree, ahead, timeout) for the block, closed when it ends,
    or one kept from an earlier block (keep_interpreters) with its time reset."""
    key, it = None, None
    if _KEPT is not None:  # keeping: the same tree, start-up jobs and environment
        env = {k: v for k, v in scenario_env(tree).items() if k not in _PER_TEST_ENV}
        key = (str(tree), json.dumps(list(ahead), sort_keys=True), json.dumps(env, sort_keys=True))
        for i, (k, _) in enumerate(_KEPT):
            if k == key:
                it = _KEPT.pop(i)[1]
                break
    if it is not None and it.proc.poll() is None:  # alive: as it started, time reset
        it.timeout, it.deadline = timeout, time.monotonic() + timeout
        it._stderr.truncate(0)
    else:
        if it is not None:
            it.close()  # it has gone meanwhile
        it = Interpreter(tree, ahead, timeout)
    try:
        yield it
    finally:
        if key is not None and it.clean and it.proc.poll() is None:
            _KEPT.append((key, it))
            while len(_KEPT) > KEEP:
                _KEPT.pop(0)[1].close()
        else:
            it.close()


# -- the scenario checks a patch header names ------------------------------------


@dataclass(frozen=True)
class Check:
    """One scenario function of tpfix/replay that shows a patch's fix.

    `passes(result)` is True when the result shows the fixed behaviour, False
    when it shows the bug, None when it shows neither (the scenario broke for
    another reason: then the check decides nothing).  `why` says it in words.
    """

    spec: str  # "module:function" of tpfix/replay
    why: str
    passes: Callable[[dict], bool | None]
    kwargs: dict = field(default_factory=dict)


_SCENARIO = re.compile(r"^(\w+):(\w+)(?:\(\*\*(\w+)\))?$")


def scenario_check(value: str, where: str = "?") -> Check:
    """The Check of one `Scenario:` header field value (see the module doc)."""
    spec, _, why = value.strip().partition(" ")
    m = _SCENARIO.match(spec)
    if not m:
        raise Fail(
            f"{where}: Scenario: {spec!r} is not module:function or "
            "module:function(**CONSTANT) of tpfix/replay"
        )
    module, func, const = m.groups()
    if not why.strip():
        raise Fail(f"{where}: Scenario: {spec} does not say what it shows (fold it below)")
    try:
        mod = importlib.import_module(f"tpfix.replay.{module}")
    except ModuleNotFoundError:
        raise Fail(f"{where}: Scenario: {spec}: no module tpfix/replay/{module}.py") from None
    if not callable(getattr(mod, func, None)):
        raise Fail(f"{where}: Scenario: {spec}: tpfix.replay.{module} has no {func}()")
    passes = getattr(mod, f"check_{func}", None)
    if not callable(passes):
        raise Fail(
            f"{where}: Scenario: {spec}: tpfix.replay.{module} has no check_{func}() "
            "(the verdict on its result, replay.verdict)"
        )
    kwargs = getattr(mod, const, None) if const else {}
    if not isinstance(kwargs, dict):
        raise Fail(f"{where}: Scenario: {spec}: tpfix.replay.{module}.{const} is not a dict")
    return Check(f"{module}:{func}", why.strip(), passes, dict(kwargs))


def patch_checks(patchfile: Path) -> list[Check]:
    """The Checks of the `Scenario:` fields of `patchfile`'s header, in order."""
    header = read_patch(patchfile).header
    return [scenario_check(v, patchfile.name) for v in header.get_all("Scenario")]


def run_check(tree: Path, check: Check) -> dict:
    """Run `check` on `tree`; {"passed", "result"} or {"passed": None, "error"}."""
    try:
        result = run_scenario(tree, check.spec, **check.kwargs)
    except (Fail, AssertionError, OSError) as e:  # no FlashInfer pin, crash...
        return {"passed": None, "error": str(e)[-2000:]}
    result = dict(result) if isinstance(result, dict) else {"value": result}
    result.pop("stderr", None)
    return {"passed": check.passes(result), "result": _short(result)}


def _short(result: dict, limit: int = 20000) -> dict:
    text = json.dumps(result, default=str)
    return result if len(text) <= limit else {"summary": text[:limit] + "..."}


def run_vllm_tests(
    tree: Path, files: list[str], *args: str, timeout: float = 900
) -> subprocess.CompletedProcess:
    """Pytest on vLLM's own test `files` of `tree`, on CPU: the compiled
    torch.ops._C ops are stood in by vllm_cpu_stubs (a pytest plugin)."""
    cmd = ["-m", "pytest", "-p", "tpfix.replay.vllm_cpu_stubs", "-p", "no:cacheprovider"]
    return subprocess.run(
        [sys.executable, *cmd, *args, *files],
        cwd=tree,
        env=scenario_env(tree),
        text=True,
        capture_output=True,
        timeout=timeout,
    )
