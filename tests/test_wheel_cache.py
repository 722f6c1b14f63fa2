# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The built-wheel cache (tpfix.stages.wheel_cache) on a small stand-in wheel file in
a cache of its own: what keys an entry, what a restore checks, what a store
replaces.  The pipeline's use of it (a real rebuild) is in test_build.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line
from tpfix.stages import wheel_cache

TAG = get_line().tag  # the default line's cache entries
PUB = TAG.removeprefix("v")
V8, V9 = f"{PUB}+tpfix.8", f"{PUB}+tpfix.9"
NAME = f"vllm-{V8}-cp38-abi3-manylinux_2_28_x86_64.whl"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("VLLM_DIST_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel(folder: Path, data: bytes = b"the wheel's bytes") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / NAME).write_bytes(data)
    return folder / NAME


def test_a_stored_wheel_comes_back_with_its_bytes(cache: Path, tmp_path: Path):
    line = get_line()
    _store(line, V8, "x86_64", 1, _wheel(tmp_path / "built"))
    got = _restore(line, V8, "x86_64", 1, _mkdir(tmp_path / "staging"))
    assert got == tmp_path / "staging" / NAME
    assert got.read_bytes() == b"the wheel's bytes"


@pytest.mark.parametrize(
    "other",
    [
        (V9, "x86_64", 1),
        (V8, "aarch64", 1),
        (V8, "x86_64", 2),
    ],
)
def test_other_inputs_are_a_miss(cache: Path, tmp_path: Path, other):
    line = get_line()
    _store(line, V8, "x86_64", 1, _wheel(tmp_path / "built"))
    assert _restore(line, *other, _mkdir(tmp_path / "staging")) is None
    assert not list((tmp_path / "staging").iterdir())


def test_the_key_covers_the_series_and_the_build_code():
    line = get_line()
    ctx = BuildContext.resolve(line).but(version="v")
    before = wheel_cache.key(ctx, "x86_64", 1)
    assert wheel_cache.key(ctx.but(fingerprint="another series"), "x86_64", 1) != before
    names = {f.name for f in wheel_cache.KEY_FILES}
    assert {"requirements-build.lock", "build.py", "context.py", "patch.py", "quilt.py"} <= names


def test_a_changed_cached_wheel_is_dropped_with_a_warning(cache: Path, tmp_path: Path):
    line = get_line()
    _store(line, V8, "x86_64", 1, _wheel(tmp_path / "built"))
    (entry,) = (cache / "built" / f"{TAG}-x86_64").iterdir()
    (entry / NAME).write_bytes(b"tampered")
    warned = []
    got = _restore(line, V8, "x86_64", 1, _mkdir(tmp_path / "staging"), warned.append)
    assert got is None
    assert not list((tmp_path / "staging").iterdir())  # the copy is gone too
    assert len(warned) == 1 and "not the bytes recorded" in warned[0] and NAME in warned[0]
    assert not entry.exists()


def test_storing_replaces_the_older_entries_of_the_line_and_arch(cache: Path, tmp_path: Path):
    line = get_line()
    _store(line, V8, "x86_64", 1, _wheel(tmp_path / "a", b"eight"))
    _store(line, V9, "x86_64", 1, _wheel(tmp_path / "b", b"nine"))
    _store(line, V8, "aarch64", 1, _wheel(tmp_path / "c", b"arm"))
    assert len(list((cache / "built" / f"{TAG}-x86_64").iterdir())) == 1
    staging = _mkdir(tmp_path / "staging")
    assert _restore(line, V8, "x86_64", 1, staging) is None
    assert _restore(line, V9, "x86_64", 1, staging).read_bytes() == b"nine"
    assert _restore(line, V8, "aarch64", 1, staging).read_bytes() == b"arm"


def _store(line, version: str, arch: str, epoch: int, wheel: Path) -> None:
    wheel_cache.store(line, arch, _key(line, version, arch, epoch), wheel)


def _restore(line, version: str, arch: str, epoch: int, dest: Path, warn=print) -> Path | None:
    return wheel_cache.restore(line, arch, _key(line, version, arch, epoch), dest, warn)


def _key(line, version: str, arch: str, epoch: int) -> str:
    return wheel_cache.key(BuildContext.resolve(line).but(version=version), arch, epoch)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
