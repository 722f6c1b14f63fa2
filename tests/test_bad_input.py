# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bad input gets a clear error naming the file and the fix, and loses nothing.

Each test runs the real scripts in a copy of this repository's pipeline files
(scripts/, pins/, patches/, VERSION) with one thing broken.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_copy import run_in_copy, run_pipeline

from tpfix.lines import get_line, sdist_pin
from tpfix.patch_format import read_series
from tpfix.util import cache_dir

FAKE_SHA = "0" * 64


def _set_sdist_sha(repo: Path, sha: str) -> None:
    pins = repo / "patches" / "v0.27.1" / "pins.toml"
    pins.write_text(pins.read_text().replace(sdist_pin(get_line().tag).sha256, sha))


@pytest.mark.slow  # downloads the sdist (pip)
def test_wrong_hash_names_file_expected_and_actual(repo: Path, tmp_path: Path):
    _set_sdist_sha(repo, FAKE_SHA)
    cache = tmp_path / "cache"
    proc = run_in_copy(repo, "-m", "tpfix.patch", str(tmp_path / "tree"), cache=cache)
    assert proc.returncode == 2
    err = proc.stderr
    assert "vllm-0.27.1.tar.gz: sha256 mismatch" in err
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
        "from tpfix.fetch import fetch_sdist; print(fetch_sdist('v0.27.1'))",
        cache=cache,
    )
    assert proc.returncode == 0, proc.stderr
    assert "truncated or interrupted download" in proc.stderr
    assert entry.stat().st_size == pin.size


def test_truncated_file_is_named_with_sizes_and_hashes(tmp_path: Path):
    from tpfix.fetch import check_file
    from tpfix.util import Fail

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
    pins = repo / "patches" / "v0.27.1" / "pins.toml"
    pins.write_text(
        pins.read_text().replace(
            'version = "0.27.1"\nrole = "sdist"', 'version = "0.27.99"\nrole = "sdist"'
        )
    )
    proc = run_in_copy(repo, "-m", "tpfix.fetch", cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert "vllm-0.27.1.tar.gz: vllm==0.27.99 is not available" in proc.stderr


def _break_patch(repo: Path, how: str) -> str:
    name = read_series(get_line().series)[0]
    p = repo / "patches" / get_line().tag / name
    text = p.read_text()
    if how == "conflict":
        text = text.replace(
            " # From versions.json: .flashinfer.version", " # From versions.json: something else", 1
        )
    else:  # shift the first hunk's position: an offset
        text = text.replace("@@ -811,7 +811,7 @@", "@@ -801,7 +801,7 @@", 1)
    p.write_text(text)
    return name


@pytest.mark.parametrize("how", ["conflict", "offset"])
def test_unappliable_patch_names_patch_and_file_and_leaves_no_tree(
    repo: Path, tmp_path: Path, how: str
):
    name = _break_patch(repo, how)
    dest = tmp_path / "out" / "tree"
    proc = run_in_copy(repo, "-m", "tpfix.patch", str(dest))
    assert proc.returncode == 2, proc.stderr
    assert f"patches/v0.27.1/{name}" in proc.stderr
    assert "docker/Dockerfile" in proc.stderr
    assert ("offset" in proc.stderr) == (how == "offset")
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no half-patched temporary either


def test_missing_quilt_is_named_with_the_fix(repo: Path, tmp_path: Path):
    proc = run_in_copy(repo, "-m", "tpfix.patch", str(tmp_path / "t"), env={"PATH": "/nonexistent"})
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
    shutil.copytree(repo / "patches" / "v0.33.0", bad)
    proc = build("--line", "v0.40.0")
    assert proc.returncode == 2
    assert "patches/v0.40.0/VERSION: names v0.33.0, not the folder's tag v0.40.0" in proc.stderr
    (bad / "VERSION").write_text("0.40.0+tpfix.2\n")
    (bad / "pins.toml").unlink()
    proc = build("--line", "v0.40.0")
    assert proc.returncode == 2
    assert "patches/v0.40.0/pins.toml is missing: a line folder holds" in proc.stderr
    # VERSION's revision must be the newest of the line's CHANGELOG.md
    (repo / "patches" / "v0.27.1" / "VERSION").write_text("0.27.1+tpfix.9\n")
    proc = build()
    assert proc.returncode == 2
    assert (
        "patches/v0.27.1/VERSION: 0.27.1+tpfix.9, but patches/v0.27.1/CHANGELOG.md's newest "
        f"entry is {get_line('v0.27.1').version}; run: python -m tpfix.maint.revision "
        "bump v0.27.1"
    ) in proc.stderr
    assert "Traceback" not in proc.stderr
    # nothing left behind: no dist folder, no state folder (lock) under build/dists/
    assert not dist.exists()
    assert not (repo / "build" / "dists").exists() or not any((repo / "build" / "dists").iterdir())
    assert not any(cache.glob("sha256/*/*")), "nothing is downloaded for a wrong line"


@pytest.mark.parametrize(
    "text,message",
    [
        ("0.27.1-tpfix", "VERSION: '0.27.1-tpfix' is not a PEP 440 version"),
        ("0.27.1+TPFIX.1", "VERSION: write the normalized form '0.27.1+tpfix.1'"),
        ("0.27.2+tpfix.1", "VERSION: public version 0.27.2 has no pins (v0.27.2.toml is missing)"),
        ("0.27.1+other.1", "VERSION: '0.27.1+other.1' needs the local label +tpfix.<n>"),
    ],
)
def test_bad_version_file_is_refused(repo: Path, text: str, message: str):
    (repo / "patches" / "v0.27.1" / "VERSION").write_text(text + "\n")
    read = "lines.read_version(lines.LINES / lines.TAG / 'VERSION')"
    code = f"from tpfix import lines, util; util.main_wrapper(lambda: {read})"
    proc = run_in_copy(repo, "-c", code)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.slow  # a real build, killed inside setup.py
def test_interrupted_build_leaves_dist_untouched(repo: Path, tmp_path: Path):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "vllm-0.27.1+tpfix.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"old")
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
            time.sleep(8)  # setup.py is now copying files into the staging area
            os.killpg(proc.pid, signal.SIGTERM)
            break
    rc = proc.wait(timeout=120)
    rest = proc.stderr.read()
    assert rc != 0, "".join(seen) + rest
    assert {p.name: p.read_bytes() for p in dist.iterdir()} == before
    assert not list(dist.glob(".staging-*"))
    assert not list((tmp_path / "work").glob("tree.*"))


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
    (dist / ".staging-first").mkdir(parents=True)
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
        assert (dist / ".staging-first").is_dir()
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
    assert "vllm-0.27.1.tar.gz: vllm==0.27.1 is not available" in proc.stderr
    # What the killed build left is gone, removed under the lock; nothing else is left.
    assert not list(work.glob("tree.*"))
    assert not list(dist.glob(".staging-*"))
    assert (work / ".lock").read_text() == ""
