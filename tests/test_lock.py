# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The locks of build/venv (ci/*.lock, tpfix.maint.lock): hashed, consistent,
within every line's requirements, and what this venv holds."""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import pytest

from tpfix.core.util import Fail
from tpfix.maint import lock


def test_the_locks_hold_for_every_line():
    # every line's requirements/common.txt, read from its pinned sdist
    assert lock.problems() == []


def test_this_venv_holds_the_locked_versions():
    """ci/venv.sh installed the locks (the suite runs on what they name)."""
    wrong = []
    for _, path in lock.LAYERS:
        for pin in lock.read_lock(path).values():
            try:
                got = importlib.metadata.version(pin.name)
            except importlib.metadata.PackageNotFoundError:
                got = None
            if got != pin.version:
                wrong.append(f"{pin.name}: {got} installed, {pin.version} locked")
    assert wrong == []


@pytest.fixture
def layers(tmp_path: Path, monkeypatch) -> list[tuple[Path, Path]]:
    """Copies of the inputs and locks, which the test may break."""
    copied = []
    for src, path in lock.LAYERS:
        copied.append((tmp_path / src.name, tmp_path / path.name))
        shutil.copy(src, copied[-1][0])
        shutil.copy(path, copied[-1][1])
    monkeypatch.setattr(lock, "LAYERS", copied)
    return copied


def _repin(path: Path, name: str, version: str) -> None:
    text = path.read_text()
    old = lock.read_lock(path)[name]
    assert f"\n{old.name}=={old.version} " in text
    path.write_text(text.replace(f"\n{old.name}=={old.version} ", f"\n{old.name}=={version} "))


def test_a_pin_outside_a_lines_range_is_named(layers):
    # v0.33.0 asks transformers >= 5.16.1, < 5.21.0; v0.27.1 only >= 5.5.3
    _repin(layers[1][1], "transformers", "5.25.0")
    found = lock.problems()
    assert len(found) == 1
    assert "transformers==5.25.0 does not meet transformers<5.21.0,>=5.16.1" in found[0]
    assert "v0.33.0 requirements/common.txt" in found[0]


def test_a_pin_the_input_does_not_allow_is_named(layers):
    _repin(layers[0][1], "torch", "2.14.0")
    found = lock.problems()
    assert any("torch==2.14.0 does not meet torch==2.13.0" in p for p in found)
    # and the test lock, which also pins torch's dependents, is not asked about torch
    assert all("requirements-build.lock" in p for p in found)


def test_locks_that_disagree_are_named(layers):
    shared = set(lock.read_lock(layers[0][1])) & set(lock.read_lock(layers[2][1]))
    name = sorted(shared)[0]
    _repin(layers[2][1], name, "0.0.1")
    assert any(
        f"disagree on {lock.read_lock(layers[2][1])[name].name}" in p for p in lock.problems()
    )


def test_a_package_pinned_twice_in_a_lock_is_refused(layers):
    path = layers[2][1]
    first = next(iter(lock.read_lock(path).values()))
    path.write_text(path.read_text() + f"\n{first.name}==0.0.1 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(Fail, match=f"requirements-test\\.lock: {first.name} is pinned twice"):
        lock.problems()


def test_a_pin_without_a_hash_is_refused(layers):
    path = layers[2][1]
    path.write_text(path.read_text() + "\nsomething==1.0\n")
    with pytest.raises(Fail, match=r"requirements-test\.lock: entry \d+ is not `name==version"):
        lock.problems()


def test_a_missing_lock_says_how_to_make_it(layers):
    layers[1][1].unlink()
    assert lock.problems() == [f"{layers[1][1]} is missing: run python -m tpfix.maint.lock"]


def test_markers_are_those_of_the_venvs_target(monkeypatch):
    text = (
        'a >= 1; platform_machine == "s390x"\nb == 2; python_version > "3.11"\n'
        "c >= 3  # comment\n-r other.txt\n"
        'd == 4; python_full_version == "3.11.0" and platform_machine == "x86_64"\n'
    )
    assert [str(r).split(";")[0] for r in lock.requirements(text, "x")] == ["c>=3", "d==4"]
    # the target's markers, not this interpreter's
    monkeypatch.setitem(lock.TARGET, "platform_machine", "s390x")
    assert [str(r).split(";")[0] for r in lock.requirements(text, "x")] == ["a>=1", "c>=3"]
