# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The build stage compiles no Rust: a tree with a setuptools-rust extension
(v0.34.0's optional `vllm-rs` frontend, which its official x86_64 wheel does
not carry, so its setup.py falls back to a local cargo build) builds without
calling cargo and ships no Rust part upstream's wheel lacks.  A tiny
setuptools project stands in for vLLM's setup.py; `cargo` and `rustc` are
stubs that record their calls.  Also: the sdist's [build-system] requires are checked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tpfix.stages import build

SETUP = """\
from setuptools import setup
from setuptools_rust import Binding, RustExtension
setup(
    name="tiny", version="1.0", packages=["tiny"],
    rust_extensions=[RustExtension("tiny.tiny-rs", path="Cargo.toml",
                                   binding=Binding.Exec, optional=True)],
)
"""


def _run(tmp_path: Path, setup_wrapper: str) -> tuple[subprocess.CompletedProcess, Path]:
    tree = tmp_path / "tree"
    (tree / "tiny").mkdir(parents=True)
    (tree / "tiny" / "__init__.py").write_text("")
    (tree / "setup.py").write_text(SETUP)
    (tree / "Cargo.toml").write_text('[package]\nname = "tiny-rs"\nversion = "1.0.0"\n')
    calls, stubs = tmp_path / "rust-calls", tmp_path / "bin"
    stubs.mkdir()
    for tool in ("cargo", "rustc"):  # record the call, fail as an absent toolchain would
        (stubs / tool).write_text(f'#!/bin/sh\necho {tool} "$@" >> {calls}\nexit 1\n')
        (stubs / tool).chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", setup_wrapper, "linux_x86_64", str(out), "13.0"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    return proc, calls


def test_no_local_rust_build(tmp_path):
    proc, calls = _run(tmp_path, build._SETUP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not calls.exists()  # neither cargo nor rustc ran
    assert "tpfix: no local Rust build" in proc.stdout
    (wheel,) = (tmp_path / "out").glob("*.whl")
    assert [n for n in zipfile.ZipFile(wheel).namelist() if "tiny-rs" in n] == []


def test_without_it_setuptools_rust_runs_cargo(tmp_path):
    """The test above can fail: setup.py alone runs the Rust toolchain."""
    plain = build._SETUP.split("try:  # trees with Rust parts")[0]
    plain += 'sys.argv = ["setup.py", "bdist_wheel", "--dist-dir", sys.argv[2]]\n'
    plain += 'runpy.run_path("setup.py", run_name="__main__")\n'
    proc, calls = _run(tmp_path, plain)
    assert calls.exists(), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("requires", "said"),
    [
        ('["setuptools-rust>=1.9.0", "torch == 2.14.0", "wheel"]', []),
        (
            '["setuptools-rust>=99"]',
            ["requires setuptools-rust>=99; build/venv has setuptools-rust=="],
        ),
        ('["not-a-real-package-x"]', ["requires not-a-real-package-x; build/venv has none"]),
    ],
)
def test_build_requirements_are_checked(requires, said):
    got = build.build_requirement_problems(
        textwrap.dedent(f"[build-system]\nrequires = {requires}\n"), "pyproject.toml"
    )
    assert len(got) == len(said)
    for line, part in zip(got, said):
        assert part in line and line.startswith("pyproject.toml [build-system]")
        assert line.endswith(
            "add it to ci/requirements-build.txt and run python -m tpfix.maint.lock"
        )
