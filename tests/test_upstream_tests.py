# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The vLLM tests each patch carries (in vLLM's own tests/ layout) are red/green.

For every patch that adds or changes test functions under the vLLM tree's
tests/, the test files are run with pytest (vLLM's own conftest included):
with the patch, each of those test functions must pass and none may be
skipped, except those marked for several GPUs (`@multi_gpu_only`,
`@multi_gpu_test`: upstream's CI runs them), which must skip for exactly that
reason; in the tree before the patch, with the patched test files copied in,
the others must fail.  Tests a patch does not touch may skip (upstream's
2-GPU tests do on a CPU host).

They run on CPU: scripts/tpfix/replay/vllm_cpu_stubs.py stands in for the compiled
`torch.ops._C` ops that vLLM modules look up at import and reports zero
accelerators (see its docstring); everything else is vLLM's own code and the
FlashInfer release the tree pins.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.replay.harness import run_vllm_tests, tree_after, tree_before

PATCHES = get_line().patches

# runs vLLM's own test files in each tree, with and without each patch
pytestmark = pytest.mark.slow

_DEF = re.compile(r"(?:async )?def (\w+)")
_GPU_MARK = re.compile(r"@multi_gpu_(?:only|test)\(")


def _changed_tests(name: str) -> dict[str, set[str]]:
    """{vLLM test file: test functions whose lines the patch adds or changes}."""
    changed: dict[str, set[str]] = {}
    current = func = None
    for line in (PATCHES / name).read_text().splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].split("/", 1)[1]
            current = path if re.match(r"tests/(.*/)?test_[^/]+\.py$", path) else None
        elif current is None or line.startswith("--- "):
            continue
        elif line.startswith("@@"):
            # diff -p names the function a hunk starts in.
            m = re.search(r"@@ " + _DEF.pattern, line)
            func = m.group(1) if m else None
        elif line[:1] in ("+", "-", " "):
            if m := _DEF.match(line[1:]):
                func = m.group(1)
            if line[0] != " " and func and func.startswith("test_"):
                changed.setdefault(current, set()).add(func)
    return changed


CASES = [(n, _changed_tests(n)) for n in read_series(get_line().series) if _changed_tests(n)]


def _pytest(tree: Path, files: list[str]) -> subprocess.CompletedProcess:
    return run_vllm_tests(tree, files, "-rA", "-q")


def _outcomes(out: str) -> dict[str, set[str]]:
    """{test function name: outcomes} from pytest's -rA summary."""
    res: dict[str, set[str]] = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", out, re.M):
        func = re.sub(r"\[.*$", "", m.group(2).split("::")[-1])
        res.setdefault(func, set()).add(m.group(1))
    return res


def _gpu_only_tests(name: str) -> set[str]:
    """Test functions the patch adds with a several-GPU mark."""
    gpu, marked = set(), False
    for line in (PATCHES / name).read_text().splitlines():
        if line.startswith("+@"):
            marked = marked or bool(_GPU_MARK.match(line[1:]))
        elif line.startswith("+") and (m := _DEF.match(line[1:])):
            if marked and m.group(1).startswith("test_"):
                gpu.add(m.group(1))
            marked = False
    return gpu


def _changes_code(name: str) -> bool:
    """The patch changes vLLM's Python code (not only requirements files)."""
    return any(
        re.match(r"\+\+\+ [^/\s]+/vllm/\S+\.py(\s|$)", line)
        for line in (PATCHES / name).read_text().splitlines()
    )


def test_patches_carry_vllm_tests():
    code = [n for n in read_series(get_line().series) if _changes_code(n)]
    assert code, "the scan finds no code patch"
    assert {n for n, _ in CASES} >= set(code), (
        "every patch that changes vLLM's code carries tests in vLLM's layout"
    )


@pytest.mark.parametrize("name,changed", CASES, ids=[c[0] for c in CASES])
def test_patch_tests_pass_with_the_patch(name: str, changed: dict[str, set[str]]):
    proc = _pytest(tree_after(name), sorted(changed))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    outcomes = _outcomes(proc.stdout)
    gpu = _gpu_only_tests(name)
    for func in sorted(set().union(*changed.values()) - gpu):
        assert outcomes.get(func, set()) == {"PASSED"}, f"{func}: {outcomes.get(func)}\n{out}"
    for file, funcs in changed.items():  # runs in upstream's multi-GPU CI only
        for func in sorted(funcs & gpu):
            assert func not in outcomes, f"{func}: {outcomes[func]}\n{out}"
            skipped = rf"^SKIPPED \[\d+\] {re.escape(file)}:\d+: Need at least \d+ GPUs"
            assert re.search(skipped, proc.stdout, re.M), f"{func} did not skip\n{out}"


@pytest.mark.parametrize("name,changed", CASES, ids=[c[0] for c in CASES])
def test_patch_tests_fail_without_the_patch(
    name: str, changed: dict[str, set[str]], tmp_path: Path
):
    # A private copy of the tree before the patch, with the patch's tests in it.
    before = tmp_path / "tree"
    shutil.copytree(tree_before(name), before, symlinks=True)
    after = tree_after(name)
    for f in changed:
        (before / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(after / f, before / f)
    proc = _pytest(before, sorted(changed))
    assert proc.returncode in (1, 2), proc.stdout[-6000:] + proc.stderr[-2000:]
    outcomes = _outcomes(proc.stdout)
    funcs = set().union(*changed.values()) - _gpu_only_tests(name)
    red = {f for f in funcs if outcomes.get(f, set()) & {"FAILED", "ERROR"}}
    collection_error = re.search(r"^ERROR \S+\.py( |$)", proc.stdout, re.M)
    assert red or collection_error, f"{name}: its tests pass without it\n{proc.stdout[-6000:]}"
    print(f"{name}: {len(red)}/{len(funcs)} changed tests red before the patch")
