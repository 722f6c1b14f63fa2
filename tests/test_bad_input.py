# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bad input gets a clear error naming the file and the fix, and loses nothing.

Each test runs the real scripts in a copy of this repository's pipeline files
(scripts/, pins/, patches/, VERSION) with one thing broken.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_copy import run_in_copy, run_pipeline

from tpfix.core.lines import get_line, revision_number, sdist_pin
from tpfix.core.patch_format import read_series, split
from tpfix.core.util import cache_dir

FAKE_SHA = "0" * 64
# The default line (the top-level VERSION) is the one broken here: the
# pipeline builds it when no --line is given.
LINE = get_line()
TAG = LINE.tag
PUB = TAG.removeprefix("v")  # its upstream version, e.g. 0.27.1
SDIST = sdist_pin(TAG).filename
_major, _minor, _micro = PUB.split(".")
UNPINNED = f"{_major}.{_minor}.{int(_micro) + 1}"  # a release with no line folder


def _set_sdist_sha(repo: Path, sha: str) -> None:
    pins = repo / "patches" / TAG / "pins.toml"
    pins.write_text(pins.read_text().replace(sdist_pin(TAG).sha256, sha))


@pytest.mark.slow  # downloads the sdist (pip)
def test_wrong_hash_names_file_expected_and_actual(repo: Path, tmp_path: Path):
    _set_sdist_sha(repo, FAKE_SHA)
    cache = tmp_path / "cache"
    proc = run_in_copy(repo, "-m", "tpfix.stages.patch", str(tmp_path / "tree"), cache=cache)
    assert proc.returncode == 2
    err = proc.stderr
    assert f"{SDIST}: sha256 mismatch" in err
    assert f"expected {FAKE_SHA}" in err
    assert f"got {sdist_pin(get_line().tag).sha256}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "tree").exists()
    assert not any(cache.glob("sha256/*/*"))
    assert list((cache / "tmp").iterdir()) == []


@pytest.mark.slow  # downloads the sdist (pip)
def test_corrupt_cache_entry_is_replaced_by_a_verified_download(repo: Path, tmp_path: Path):
    # An interrupted download from some other tool left a truncated file where
    # the cache entry belongs: it must be refused and fetched again.
    pin = sdist_pin(get_line().tag)
    cache = tmp_path / "cache"
    entry = cache / "sha256" / pin.sha256 / pin.filename
    entry.parent.mkdir(parents=True)
    good = cache_dir() / "sha256" / pin.sha256 / pin.filename
    entry.write_bytes(good.read_bytes()[: pin.size // 3])
    proc = run_in_copy(
        repo,
        "-c",
        f"from tpfix.stages.fetch import fetch_sdist; print(fetch_sdist({TAG!r}))",
        cache=cache,
    )
    assert proc.returncode == 0, proc.stderr
    assert "truncated or interrupted download" in proc.stderr
    assert entry.stat().st_size == pin.size


def test_truncated_file_is_named_with_sizes_and_hashes(tmp_path: Path):
    from tpfix.core.util import Fail
    from tpfix.stages.fetch import check_file

    pin = sdist_pin(get_line().tag)
    part = tmp_path / pin.filename
    part.write_bytes(b"\0" * 1000)
    with pytest.raises(Fail) as err:
        check_file(part, pin)
    assert str(err.value).startswith(f"{pin.filename}: 1000 bytes, the pin says {pin.size}")
    actual = hashlib.sha256(bytes(1000)).hexdigest()
    assert f"expected sha256 {pin.sha256}, got {actual}" in str(err.value)


@pytest.mark.slow  # asks the package index
def test_missing_artifact_is_reported(repo: Path, tmp_path: Path):
    pins = repo / "patches" / TAG / "pins.toml"
    sdist = f'version = "{PUB}"\nrole = "sdist"'
    assert sdist in pins.read_text()
    pins.write_text(pins.read_text().replace(sdist, f'version = "{PUB}99"\nrole = "sdist"'))
    proc = run_in_copy(repo, "-m", "tpfix.stages.fetch", cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert f"{SDIST}: vllm=={PUB}99 is not available" in proc.stderr


def _break_patch(repo: Path, how: str) -> tuple[str, str]:
    """Break the line's first patch: the first line it removes changed (a
    conflict), or its first hunk moved by 10 lines (an offset); (the patch,
    the file of the broken hunk)."""
    name = read_series(LINE.series)[0]
    p = repo / "patches" / TAG / name
    header, diff = split(p.read_text())
    if how == "conflict":
        m = re.search(r"^-(?!--).*$", diff, re.M)
        hunk = "-something else"
    else:
        m = re.search(r"^@@ -(\d+)(,\d+)? \+(\d+)", diff, re.M)
        shift = -10 if int(m[1]) > 10 else 10
        hunk = f"@@ -{int(m[1]) + shift}{m[2] or ''} +{int(m[3]) + shift}"
    p.write_text(header + diff[: m.start()] + hunk + diff[m.end() :])
    *_, path = re.findall(r"^\+\+\+ b/(\S+)", diff[: m.start()], re.M)
    return name, path


@pytest.mark.parametrize("how", ["conflict", "offset"])
def test_unappliable_patch_names_patch_and_file_and_leaves_no_tree(
    repo: Path, tmp_path: Path, how: str
):
    name, path = _break_patch(repo, how)
    dest = tmp_path / "out" / "tree"
    proc = run_in_copy(repo, "-m", "tpfix.stages.patch", str(dest))
    assert proc.returncode == 2, proc.stderr
    assert f"patches/{TAG}/{name}" in proc.stderr
    assert path in proc.stderr
    assert ("offset" in proc.stderr) == (how == "offset")
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no half-patched temporary either


def test_missing_quilt_is_named_with_the_fix(repo: Path, tmp_path: Path):
    proc = run_in_copy(
        repo, "-m", "tpfix.stages.patch", str(tmp_path / "t"), env={"PATH": "/nonexistent"}
    )
    assert proc.returncode == 2
    assert "`quilt` not found on PATH; install it (Debian: apt-get install quilt)" in proc.stderr
    assert not (tmp_path / "t").exists()


def test_a_wrong_line_is_refused_before_any_work(repo: Path, tmp_path: Path):
    cache, dist = tmp_path / "cache", tmp_path / "dist"

    def build(*args: str):
        return run_pipeline(repo, dist, None, *args, cache=cache)

    proc = build("--line", "v9.9.9")
    assert proc.returncode == 2 and "invalid choice: 'v9.9.9'" in proc.stderr
    # a line folder whose VERSION names another tag (a copy started by hand)
    bad = repo / "patches" / "v0.40.0"
    shutil.copytree(repo / "patches" / "v0.34.0", bad)
    proc = build("--line", "v0.40.0")
    assert proc.returncode == 2
    assert "patches/v0.40.0/VERSION: names v0.34.0, not the folder's tag v0.40.0" in proc.stderr
    (bad / "VERSION").write_text("0.40.0+tpfix.2\n")
    (bad / "pins.toml").unlink()
    proc = build("--line", "v0.40.0")
    assert proc.returncode == 2
    assert "patches/v0.40.0/pins.toml is missing: a line folder holds" in proc.stderr
    # VERSION's revision must be the newest of the line's CHANGELOG.md
    ahead = f"{PUB}+tpfix.{revision_number(LINE, LINE.version) + 1}"
    (repo / "patches" / TAG / "VERSION").write_text(ahead + "\n")
    proc = build()
    assert proc.returncode == 2
    assert (
        f"patches/{TAG}/VERSION: {ahead}, but patches/{TAG}/CHANGELOG.md's newest "
        f"entry is {LINE.version}; run: python -m tpfix.maint.revision bump {TAG}"
    ) in proc.stderr
    assert "Traceback" not in proc.stderr
    # nothing left behind: no dist folder, no state folder (lock) under build/dists/
    assert not dist.exists()
    assert not (repo / "build" / "dists").exists() or not any((repo / "build" / "dists").iterdir())
    assert not any(cache.glob("sha256/*/*")), "nothing is downloaded for a wrong line"


@pytest.mark.parametrize(
    "text,message",
    [
        (f"{PUB}-tpfix", f"VERSION: '{PUB}-tpfix' is not a PEP 440 version"),
        (f"{PUB}+TPFIX.1", f"VERSION: write the normalized form '{PUB}+tpfix.1'"),
        (
            f"{UNPINNED}+tpfix.1",
            f"VERSION: public version {UNPINNED} has no pins (v{UNPINNED}.toml is missing)",
        ),
        (f"{PUB}+other.1", f"VERSION: '{PUB}+other.1' needs the local label +tpfix.<n>"),
    ],
)
def test_bad_version_file_is_refused(repo: Path, text: str, message: str):
    (repo / "patches" / TAG / "VERSION").write_text(text + "\n")
    read = "lines.read_version(lines.LINES / lines.TAG / 'VERSION')"
    code = f"from tpfix.core import lines, util; util.main_wrapper(lambda: {read})"
    proc = run_in_copy(repo, "-c", code)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.slow  # a real build, killed inside setup.py
def test_interrupted_build_leaves_dist_untouched(repo: Path, tmp_path: Path):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / f"vllm-{PUB}+tpfix.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"old")
    (dist / "SHA256SUMS").write_text("old\n")
    before = {p.name: p.read_bytes() for p in dist.iterdir()}
    venv_py = Path(sys.executable)
    proc = subprocess.Popen(
        [
            str(venv_py),
            "-m",
            "tpfix.pipeline",
            "--dist",
            str(dist),
            "--workdir",
            str(tmp_path / "work"),
            "--no-cache",  # a real setup.py to kill, not the cached wheel
        ],
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=str(repo / "scripts")),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("==> build:"):
            time.sleep(8)  # setup.py is now copying files into the staging folder
            os.killpg(proc.pid, signal.SIGTERM)
            break
    rc = proc.wait(timeout=120)
    rest = proc.stderr.read()
    assert rc != 0, "".join(seen) + rest
    assert {p.name: p.read_bytes() for p in dist.iterdir()} == before  # nothing staged there
    assert not list((tmp_path / "work").glob("tree.*"))
    assert not list((tmp_path / "work").glob("staging-*"))


# A first build holding its folders, through the pipeline's own lock (build_locks):
# it leaves a tree and a staging folder as a running build has, and sleeps.
_HOLDER = """
import sys, time
from pathlib import Path
from tpfix.pipeline import build_locks
work, dist = Path(sys.argv[1]), Path(sys.argv[2])
with build_locks(work, dist):
    (work / "tree.first" / "vllm").mkdir(parents=True)
    (work / "tree.first" / "vllm" / "setup.py").write_text("the first build's tree")
    (work / "staging-first").mkdir(parents=True)
    print("locked", flush=True)
    time.sleep(300)
"""


def _first_build(repo: Path, work: Path, dist: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(work), str(dist)],
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=str(repo / "scripts")),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_second_build_in_the_same_folders_stops_naming_the_first(repo: Path, tmp_path: Path):
    work, dist = tmp_path / "work", tmp_path / "dist"
    first = _first_build(repo, work, dist)
    try:
        t0 = time.monotonic()
        proc = run_pipeline(repo, dist, work)
        took = time.monotonic() - t0
        assert proc.returncode == 2, proc.stderr
        assert took < 30, took  # at once: before fetching anything
        err = proc.stderr
        assert f"error: work folder {work} is in use by another build: pid {first.pid} " in err
        assert "started 20" in err
        assert "command: " in err and "build_locks(work, dist)" in err  # its command line
        assert "Wait until that build has finished" in err
        assert "--workdir DIR --dist DIR" in err
        assert "Traceback" not in err
        assert "==> patch" not in err
        # Its own work folder, the same dist folder: refused too, naming the dist.
        proc = run_pipeline(repo, dist, tmp_path / "w2")
        assert proc.returncode == 2, proc.stderr
        assert f"error: dist folder {dist} is in use by another build: pid {first.pid}" in (
            proc.stderr
        )
        assert "./build.sh --dist DIR" in proc.stderr
        # The first build's tree and staging folder are untouched.
        tree = work / "tree.first" / "vllm" / "setup.py"
        assert tree.read_text() == "the first build's tree"
        assert (work / "staging-first").is_dir()
        assert first.poll() is None
    finally:
        first.kill()
        first.wait()


def test_lock_of_a_killed_build_does_not_block(repo: Path, tmp_path: Path):
    work, dist = tmp_path / "work", tmp_path / "dist"
    first = _first_build(repo, work, dist)
    first.kill()  # SIGKILL: no clean-up; the kernel drops its flock
    first.wait()
    assert f"pid: {first.pid}\n" in (work / ".lock").read_text()  # its lock file stays
    # A build that stops at its first download (empty cache, no index: no
    # network either): it got past the locks and the clean-up.
    proc = run_pipeline(
        repo,
        dist,
        work,
        env={"PIP_NO_INDEX": "1"},
        cache=tmp_path / "cache",
    )
    assert proc.returncode == 2, proc.stderr
    assert "in use by another build" not in proc.stderr
    assert f"{SDIST}: vllm=={PUB} is not available" in proc.stderr
    # What the killed build left is gone, removed under the lock; nothing else is left.
    assert not list(work.glob("tree.*"))
    assert not list(work.glob("staging-*"))
    assert (work / ".lock").read_text() == ""
