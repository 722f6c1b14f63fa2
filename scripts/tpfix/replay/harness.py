# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Trees of the series and a runner that executes real vLLM code inside them.

`tree_before(p)` / `tree_after(p)` are pristine v0.27.1 plus the series up to
but excluding / including patch `p` (cached by content under
<cache>/trees).  `run_scenario(tree, "module:function", **kw)` runs
tests/scenarios/<module>.py's function in a fresh interpreter whose imports of
`vllm` come from `tree` and whose FlashInfer is the release that tree pins in
requirements/cuda.txt, and returns what the function returned (a JSON dict);
an uncaught exception comes back as {"error": type name, "message": str}.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tpfix.common import cache_dir, cache_lock, read_series
from tpfix.fetch import fetch_test_dep
from tpfix.patch import cached_tree

# The folder that holds the tpfix package: scenario interpreters import the
# replays (tpfix.replay.<module>) and the CPU stand-ins from it.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def tree_after(patch: str) -> Path:
    return cached_tree(upto=patch)


def tree_before(patch: str) -> Path:
    names = read_series()
    i = names.index(patch)
    return cached_tree(upto=names[i - 1] if i else "")


def pristine_tree() -> Path:
    return cached_tree(upto="")


def pinned_flashinfer(tree: Path) -> str:
    text = (tree / "requirements" / "cuda.txt").read_text()
    m = re.search(r"^flashinfer-python==(\S+)", text, re.M)
    assert m, f"{tree}: requirements/cuda.txt pins no flashinfer-python"
    return m.group(1)


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
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # trees are shared, keep them clean
    return env


_RUNNER = """
import importlib, json, sys, traceback
mod, fn, kwargs, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
try:
    result = getattr(importlib.import_module("tpfix.replay." + mod), fn)(**kwargs)
except BaseException as e:
    traceback.print_exc()
    result = {"error": type(e).__name__, "message": str(e)}
with open(out, "w") as f:
    json.dump(result, f)
"""


def run_scenario(tree: Path, spec: str, timeout: float = 900, **kwargs) -> dict:
    module, func = spec.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, module, func, json.dumps(kwargs), str(out)],
            env=scenario_env(tree),
            cwd=tmp,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        if not out.exists():
            raise AssertionError(
                f"scenario {spec} crashed in {tree} (rc={proc.returncode}):\n" + proc.stderr[-4000:]
            )
        result = json.loads(out.read_text())
    if isinstance(result, dict) and "error" in result:
        result.setdefault("stderr", proc.stderr[-4000:])
    return result
