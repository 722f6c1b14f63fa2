# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 3: build the wheel from the patched tree with vLLM's own setup.py.

vLLM's precompiled-kernel mode (VLLM_USE_PRECOMPILED=1) copies every compiled
binary out of the official wheel we fetched and verified, and builds the
Python part from our patched sources.  setup.py picks its target from
`torch.version.cuda`, which is None on a CPU-only torch; since nothing is
compiled here, we tell setup.py the CUDA version the official wheel was built
for (`cuda` in the line's pins), in the build process only (no sitecustomize,
nothing installed).

Nothing is compiled, Rust included: where the official wheel carries a Rust
part (the `vllm-rs` frontend, a `vllm/_rust_*.so`), vLLM's own
`precompiled_build_rust` takes it from there; where it does not (v0.34.0's
x86_64 wheel carries neither), setup.py would fall back to a local cargo
build, which would fetch a toolchain and crates and add a `vllm-rs` upstream's
wheel lacks.  The build process replaces setuptools-rust's build step by one
that says so and builds nothing (vLLM's own subclass still runs its checks).

torch's own version does not reach the wheel: in this mode setup.py reads
only `torch.version.*` (target detection) and nothing is compiled against
torch.  So every line builds with the CPU torch of ci/requirements-build.lock,
also v0.33.0 (whose pyproject asks for torch 2.14.0, which exists only as a
CUDA build with GBs of dependencies); verify.py proves it per build, file by
file against the official wheel.
"""

from __future__ import annotations

import errno
import importlib.metadata
import os
import re
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tpfix.core.util import Fail, free_bytes, run

_SETUP = """
import runpy, sys, torch
torch.version.cuda = sys.argv[3]
try:  # trees with Rust parts (v0.34.0: setuptools-rust, vllm/vllm-rs)
    import setuptools_rust.build as rust
except ImportError:
    rust = None
if rust is not None:
    def _no_local_rust(self):
        print("tpfix: no local Rust build: the wheel ships the official wheel's Rust parts, if any")
    rust.build_rust.run = _no_local_rust
sys.argv = ["setup.py", "bdist_wheel", "--py-limited-api=cp38",
            "--plat-name", sys.argv[1], "--dist-dir", sys.argv[2]]
runpy.run_path("setup.py", run_name="__main__")
"""


def build_requirement_problems(pyproject: str, where: str) -> list[str]:
    """Each of `pyproject`'s [build-system] requires that this interpreter's
    environment (build/venv) does not meet, said in one line with the way
    out.  torch is left out on purpose: the CPU build of
    ci/requirements-build.lock builds every line (module docstring)."""
    problems = []
    for text in tomllib.loads(pyproject).get("build-system", {}).get("requires", []):
        req = Requirement(text)
        if req.name == "torch" or (req.marker and not req.marker.evaluate()):
            continue
        try:
            have = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            problems.append(
                f"{where} [build-system] requires {req}; build/venv has "
                f"{req.name + '==' + have if have else 'none'}: add it to "
                "ci/requirements-build.txt and run python -m tpfix.maint.lock"
            )
    return problems


def source_date_epoch(sdist: Path) -> int:
    """$SOURCE_DATE_EPOCH, else a fixed timestamp derived from the input (the
    sdist's PKG-INFO mtime): of the wheel, its SBOM and provenance, and the image."""
    if env := os.environ.get("SOURCE_DATE_EPOCH"):
        if not env.isdigit():
            raise Fail(f"SOURCE_DATE_EPOCH={env!r}: expected seconds since 1970 (digits)")
        return int(env)
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"):
                return int(m.mtime)
    raise Fail(f"{sdist.name}: no PKG-INFO to take SOURCE_DATE_EPOCH from")


def build_wheel(
    tree: Path,
    version: str,
    official_wheel: Path,
    arch: str,
    out_dir: Path,
    epoch: int,
    log: Path,
    cuda: str,
) -> Path:
    """Build into `out_dir` and return the wheel, named like the official one.

    `cuda` is the CUDA version the official wheel was built for (Line.official_cuda).
    """
    pyproject = tree / "pyproject.toml"  # no file: no declared build requirements
    problems = (
        build_requirement_problems(pyproject.read_text(), pyproject.name)
        if pyproject.exists()
        else []
    )
    if problems:
        raise Fail("\n".join(problems))
    env = dict(os.environ)
    env.update(
        VLLM_USE_PRECOMPILED="1",
        VLLM_PRECOMPILED_WHEEL_LOCATION=str(official_wheel),
        VLLM_TARGET_DEVICE="cuda",
        VLLM_VERSION_OVERRIDE=version,
        SOURCE_DATE_EPOCH=str(epoch),
        PYTHONHASHSEED="0",
    )
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        proc = run([sys.executable, "-c", _SETUP, f"linux_{arch}", tmp, cuda], cwd=tree, env=env)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 and "No space left on device" in proc.stdout + proc.stderr:
            # A full disk, not a build error: the pipeline names the file system,
            # the one of the file setup.py names, else the fuller of the two it
            # writes to (the tree's build/ and out_dir), while both still hold
            # what it wrote.
            named = re.search(r"No space left on device: '([^']+)'", proc.stdout + proc.stderr)
            full = named.group(1) if named else min((tree, out_dir), key=free_bytes)
            raise OSError(errno.ENOSPC, "No space left on device", str(full))
        if proc.returncode != 0:
            tail = "\n  ".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise Fail(f"setup.py bdist_wheel failed (full log: {log}):\n  {tail}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise Fail(f"setup.py produced {len(wheels)} wheels (log: {log})")
        # Same file name as the official wheel, with our version: the official
        # one is also named manylinux_2_28 while its WHEEL tag says linux_*.
        name = official_wheel.name.replace(official_wheel.name.split("-")[1], version, 1)
        final = out_dir / name
        os.replace(wheels[0], final)
    return final
