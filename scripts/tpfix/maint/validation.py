# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The validation runs of maint.export, per patch of a release line: the
vLLM tests the patch adds or changes (pytest in a tree, red without the
patch, green with it; a run's outcome read from pytest's report), the tests
it marks for several GPUs (they skip on this host), and the patch's scenario
checks (replay.harness).  Also used by tests/test_upstream_port.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from tpfix.core.lines import Line
from tpfix.core.patch_format import diff_files, read_series, split
from tpfix.core.util import Fail
from tpfix.replay.harness import patch_checks, run_check
from tpfix.stages.patch import cached_tree

# -- validation ------------------------------------------------------------------------


def vllm_tests(patchfile: Path) -> list[str]:
    """tests/**/test_*.py files the patch adds or changes (vLLM's own layout)."""
    files = diff_files(patchfile)
    return sorted(d.new for d in files if d.new and re.match(r"tests/(.+/)?test_[^/]+\.py$", d.new))


# vLLM's marks for a test that needs several GPUs (tests/utils.py): it skips
# with "Need at least N GPUs" on a smaller host; upstream's multi-GPU CI runs it.
_GPU_MARK = re.compile(r"@multi_gpu_(?:only|test)\(")
_DEF = re.compile(r"(?:async )?def (\w+)")


def multi_gpu_tests(patchfile: Path) -> list[str]:
    """`file::function` of each test the patch adds under a several-GPU mark
    (@multi_gpu_only, @multi_gpu_test), in vLLM's tests/ layout."""
    found, current, marked = [], None, False
    for line in split(patchfile.read_text())[1].splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].split("/", 1)[-1]
            current = path if re.match(r"tests/(.+/)?test_[^/]+\.py$", path) else None
            marked = False
        elif current is None or not line.startswith("+"):
            continue
        elif line.startswith("+@"):
            marked = marked or bool(_GPU_MARK.match(line[1:]))
        elif m := _DEF.match(line[1:]):
            if marked and m.group(1).startswith("test_"):
                found.append(f"{current}::{m.group(1)}")
            marked = False
    return found


# vLLM's tests/conftest.py cleans up after every test not marked
# skip_global_cleanup with torch.accelerator.empty_cache(), which raises on a
# host without an accelerator: a teardown error of a test that passed, not a
# failure of the code under test.
CPU_TEARDOWN = "RuntimeError: Cannot access accelerator device when none is available"


def _no_warnings(summary: str) -> str:
    """'1 passed, 2 warnings in 3s' -> '1 passed in 3s'."""
    counts, sep, rest = summary.partition(" in ")
    kept = [c for c in counts.split(", ") if not re.fullmatch(r"\d+ warnings?", c)]
    return ", ".join(kept) + sep + rest


def pytest_outcome(stdout: str) -> dict:
    """Counts of a `pytest -rfEs` run; `green`: something passed, nothing
    failed, and the only errors are CPU_TEARDOWN ones; `red`: a test failed."""
    lines = [x for x in stdout.strip().splitlines() if x.strip()]
    summary = lines[-1].strip("= ") if lines else ""
    count = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
    errors = count.get("error", 0) + count.get("errors", 0)
    # the long report: one "_ ERROR at <when> of <test> _" section per error
    sections = re.split(r"^_+ ERROR at ", stdout, flags=re.M)[1:]
    benign = sum(
        1
        for sec in sections
        if sec.startswith("teardown of ")
        and CPU_TEARDOWN in re.split(r"^(?:_{3,}|={3,}) ", sec, maxsplit=1, flags=re.M)[0]
    )
    out = {
        "summary": _no_warnings(summary),
        "passed": count.get("passed", 0),
        "failed": count.get("failed", 0),
        "skipped": count.get("skipped", 0),
        "errors": errors,
        "cpu_teardown_errors": benign,
        "skip_reasons": sorted(set(re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", stdout, re.M))),
        "failure_kinds": _failure_kinds(stdout),
    }
    out["green"] = out["passed"] > 0 and out["failed"] == 0 and errors == benign
    out["red"] = out["failed"] > 0 or errors > benign
    return out


def _failure_kinds(stdout: str) -> dict[str, int]:
    """How many failed tests raised each exception type: the first `E   Type:`
    line of each test's section of the FAILURES report."""
    report = stdout.partition("= FAILURES =")[2].partition("short test summary info")[0]
    kinds = []
    for section in re.split(r"^_+ \S+ _+$", report, flags=re.M)[1:]:
        first = re.search(r"^E\s+(.*)$", section, re.M)
        line = first.group(1) if first else ""
        if line.startswith("assert "):  # pytest's rewritten assert
            kinds.append("AssertionError")
        else:
            m = re.match(r"(?:\w+\.)*(\w+)(?::|$)", line)
            kinds.append(m.group(1) if m else "other")
    return dict(sorted(Counter(kinds).items()))


def run_pytest(tree: Path, files: list[str]) -> dict:
    from tpfix.replay.harness import run_vllm_tests

    proc = run_vllm_tests(tree, files, "-q", "-rfEs")
    res = pytest_outcome(proc.stdout)
    res["rc"] = proc.returncode
    if not res["summary"]:
        res["summary"] = proc.stderr.strip()[-300:]
    return res


def with_files(tree: Path, source: Path, files: list[str], dest: Path) -> Path:
    """`dest` = `tree` with `files` taken from `source`: a hard-linked copy
    (fast, and the cached `tree` is never written: replaced files are
    unlinked first)."""
    shutil.copytree(tree, dest, symlinks=True, copy_function=os.link)
    for f in files:
        (dest / f).unlink(missing_ok=True)
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / f, dest / f)
    return dest


def validate(line: Line, name: str) -> dict:
    """Red without `name` (on the line's tag + the ports before it), green with it."""
    patches = line.patches
    names = read_series(line.series)
    i = names.index(name)
    before = cached_tree(line, names[i - 1] if i else "")
    after = cached_tree(line, name)
    res: dict = {"tests": [], "checks": []}
    files = vllm_tests(patches / name)
    if files:
        green = run_pytest(after, files)
        with tempfile.TemporaryDirectory() as tmp:
            red = run_pytest(with_files(before, after, files, Path(tmp) / "vllm"), files)
        res["tests"].append({"files": files, "with": green, "without": red})
        if not green["green"]:
            raise Fail(f"{name}: its tests fail with the patch: {green['summary']}")
        if not red["red"]:
            raise Fail(f"{name}: its tests pass without the patch: {red['summary']}")
        gpu = multi_gpu_tests(patches / name)
        if gpu and not any(r.startswith("Need at least") for r in green["skip_reasons"]):
            raise Fail(f"{name}: {', '.join(gpu)} did not skip for want of GPUs: {green}")
    for check in patch_checks(patches / name):
        entry = {
            "spec": check.spec,
            "why": check.why,
            "without": run_check(before, check),
            "with": run_check(after, check),
        }
        res["checks"].append(entry)
        if entry["with"]["passed"] is not True or entry["without"]["passed"] is not False:
            raise Fail(
                f"{name}: scenario {check.spec} is not red without / green with it: "
                f"{json.dumps(entry)[:1500]}"
            )
    return res
