# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The locks of build/venv (ci/*.lock, tpfix.maint.lock): hashed, consistent,
complete, within every line's requirements, what this venv holds, and
installed by ci/venv.sh without resolving anything against the index."""

from __future__ import annotations

import email
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from served import Served
from wheels import make_wheel, simple_index

from tpfix.core.util import ROOT, Fail
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
    # v0.34.0 asks transformers >= 5.16.1, < 5.23.0; v0.27.1 only >= 5.5.3
    _repin(layers[1][1], "transformers", "5.25.0")
    found = lock.problems()
    assert len(found) == 1
    assert "transformers==5.25.0 does not meet transformers<5.23.0,>=5.16.1" in found[0]
    assert "v0.34.0 requirements/common.txt" in found[0]


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


# --- installing a lock resolves nothing (ci/venv.sh's install_lock) ---------

# What ci/venv.sh ran before install_lock: pip resolving while it installs.
# With the interpreter's bundled pip (23.2.1), a locked package's extra is
# looked up on the index as a requirement of its own, and the newest release
# there, which has no hash in the lock, stops the install.
PRE_FIX = ["-m", "pip", "install", "--disable-pip-version-check", "--require-hashes", "-r"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def local_index(tmp_path_factory) -> tuple[Path, Path]:
    """A PEP 503 index of tiny wheels and a lock of some of them: `tool` needs
    `cachelib[filecache]` (whose extra needs `filelock`) and `plainlib`; the
    index also holds a newer cachelib (reached through the extra, as
    cachecontrol 0.15.0 through pip-audit's `CacheControl[filecache]`) and a
    newer plainlib (a plain dependency), published after the lock."""
    root = tmp_path_factory.mktemp("index")
    wheels = root / "wheels"
    made = [
        make_wheel(wheels, "1.0", "tool", ("cachelib[filecache]>=1.0", "plainlib>=1.0")),
        make_wheel(
            wheels,
            "1.0",
            "cachelib",
            ('filelock>=1.0; extra == "filecache"',),
            ("Provides-Extra: filecache",),
        ),
        make_wheel(wheels, "1.0", "plainlib", ()),
        make_wheel(wheels, "1.0", "filelock", ()),
    ]
    make_wheel(
        wheels,
        "2.0",
        "cachelib",
        ('filelock>=1.0; extra == "filecache"',),
        ("Provides-Extra: filecache",),
    )
    make_wheel(wheels, "2.0", "plainlib", ())
    simple = simple_index(root, sorted(wheels.iterdir()))
    lock_file = root / "small.lock"
    lock_file.write_text(
        "".join(
            f"{w.name.split('-')[0]}=={w.name.split('-')[1]} \\\n    --hash=sha256:{_sha256(w)}\n"
            for w in made
        )
    )
    return simple, lock_file


@pytest.fixture(scope="module")
def stock_venv(tmp_path_factory) -> Path:
    """A venv as `python3 -m venv` makes it: the interpreter's bundled pip."""
    env = tmp_path_factory.mktemp("stock") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(env)], check=True)
    return env / "bin" / "python"


def _pip_env(index_url: str, cache: Path) -> dict[str, str]:
    """This machine's pip settings out of the way: only the local index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=index_url, PIP_CACHE_DIR=str(cache))
    return env


def _installed(python: Path) -> dict[str, str]:
    got = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {d["name"]: d["version"] for d in json.loads(got.stdout)}


def test_install_lock_installs_exactly_the_lock_from_an_index_with_newer_releases(
    local_index, stock_venv, tmp_path
):
    simple, lock_file = local_index
    with Served(simple.parent) as served:
        env = _pip_env(f"{served.url}/simple", tmp_path / "cache")
        proc = subprocess.run(
            ["bash", "-c", '. ci/venv.sh && install_lock "$@"', "-"]
            + [str(stock_venv), str(lock_file), str(tmp_path / "log")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    assert proc.returncode == 0, proc.stderr + (tmp_path / "log").read_text()
    got = _installed(stock_venv)
    want = {"tool": "1.0", "cachelib": "1.0", "plainlib": "1.0", "filelock": "1.0"}
    assert {k: got.get(k) for k in want} == want
    # nothing but the locked files was fetched: no index page was consulted
    # for a newer release (pip --no-deps asks each locked project's page once)
    asked = {p.split("/")[2] for p, _ in served.paths if p.startswith("/simple/")}
    assert asked == set(want)


def test_the_pre_fix_install_breaks_on_the_same_index(local_index, stock_venv, tmp_path):
    """The test above can fail: the command ci/venv.sh ran before install_lock
    stops on the newer cachelib that the extra reaches (pip 23.2.1)."""
    simple, lock_file = local_index
    pip_version = subprocess.run(
        [str(stock_venv), "-c", "import pip; print(pip.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if Version(pip_version) >= Version("23.3"):
        pytest.fail(f"the interpreter's bundled pip is {pip_version}: this replay needs pip < 23.3")
    fresh = tmp_path / "venv"
    subprocess.run([str(stock_venv), "-m", "venv", str(fresh)], check=True)
    with Served(simple.parent) as served:
        env = _pip_env(f"{served.url}/simple", tmp_path / "cache")
        proc = subprocess.run(
            [str(fresh / "bin" / "python"), *PRE_FIX, str(lock_file)],
            env=env,
            capture_output=True,
            text=True,
        )
    assert proc.returncode != 0
    assert "cachelib[filecache]>=1.0" in proc.stderr
    assert "must have their versions pinned with ==" in proc.stderr


def test_install_lock_refuses_an_incomplete_lock(local_index, tmp_path):
    """A lock that leaves a plain requirement out installs, and pip check names
    it (pip check does not see what an extra needs: test_each_real_lock_is_complete)."""
    simple, lock_file = local_index
    partial = tmp_path / "partial.lock"
    text = lock_file.read_text().replace("\\\n    ", "")
    partial.write_text("".join(line + "\n" for line in text.splitlines() if "plainlib" not in line))
    fresh = tmp_path / "venv"
    subprocess.run(
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(fresh)], check=True
    )
    with Served(simple.parent) as served:
        proc = subprocess.run(
            ["bash", "-c", '. ci/venv.sh && install_lock "$@"', "-"]
            + [str(fresh / "bin" / "python"), str(partial), str(tmp_path / "log")],
            cwd=ROOT,
            env=_pip_env(f"{served.url}/simple", tmp_path / "cache"),
            capture_output=True,
            text=True,
        )
    assert proc.returncode == 2
    assert "tool 1.0 requires plainlib, which is not installed" in proc.stderr
    assert "the lock is incomplete" in proc.stderr


# --- each real lock is complete -----------------------------------------


@pytest.mark.parametrize("layer", [0, 1, 2], ids=["build", "replay", "test"])
def test_each_real_lock_is_complete(layer):
    """Every requirement of every locked package, the extras asked for
    included, is itself locked: what makes installing --no-deps safe.  The
    packages' metadata is read from this venv, which holds the locked versions
    (test_this_venv_holds_the_locked_versions)."""
    src, path = lock.LAYERS[layer]
    roots = lock.requirements(src.read_text(), src.name)
    assert lock.incomplete(path, lock.installed_metadata, roots) == []


def test_completeness_names_a_missing_requirement_of_an_extra(local_index, tmp_path):
    """The check can fail: drop `filelock`, which only cachelib[filecache] needs."""
    simple, lock_file = local_index
    wheels = {w.name.split("-")[0] + "==" + w.name.split("-")[1]: w for w in simple.glob("*/*.whl")}

    def metadata(pin):
        with zipfile.ZipFile(wheels[f"{pin.name}=={pin.version}"]) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            return email.message_from_bytes(z.read(name))

    assert lock.incomplete(lock_file, metadata) == []
    text = lock_file.read_text().replace("\\\n    ", "")
    partial = tmp_path / "partial.lock"
    partial.write_text("".join(line + "\n" for line in text.splitlines() if "filelock" not in line))
    missing = 'filelock>=1.0; extra == "filecache" (required by cachelib[filecache])'
    assert lock.incomplete(partial, metadata) == [f"{partial}: no pin for {missing}"]
    # an extra asked for only by the input file counts too
    solo = tmp_path / "solo.lock"
    solo.write_text(
        "".join(line + "\n" for line in partial.read_text().splitlines() if "tool" not in line)
    )
    assert lock.incomplete(solo, metadata) == []
    assert len(lock.incomplete(solo, metadata, [Requirement("cachelib[filecache]")])) == 1


@pytest.mark.parametrize("version", ["22.3.1", "23.2", ""])
def test_install_lock_names_a_pip_older_than_it_supports(tmp_path, version):
    """Before anything installs, in one line, with the way out."""
    fake = tmp_path / "python"
    out = f"pip {version} from /somewhere (python 3.11)" if version else ""
    fake.write_text(f"#!/bin/sh\necho '{out}'\n")
    fake.chmod(0o755)
    proc = subprocess.run(
        ["bash", "-c", '. ci/venv.sh && install_lock "$@"', "-", str(fake), "x.lock", "log"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: {fake} has pip {version or 'none'}; the locks need pip >= 23.2.1: "
        f"{fake} -m pip install 'pip>=23.2.1'\n"
    )
