# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What an operator meets: output folders on other mounts, read-only or full
file systems, a build killed with kill -9 (checking a signed dist/ with
nothing but what dist/ holds: test_dist_verify.py).

The mount tests need root (or CAP_SYS_ADMIN), as this machine and CI have;
where mounting is refused they are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_copy import run_pipeline
from small_dist import SIDE, check_sums
from wheels import make_wheel

from tpfix import pipeline
from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line
from tpfix.core.util import ROOT, Fail
from tpfix.stages import package


def _mount(target: Path, *args: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting is not permitted here (mount {' '.join(args)}: {proc.stderr})")


@contextlib.contextmanager
def _mounted(target: Path, *args: str):
    _mount(target, *args)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


def _tmpfs(target: Path, size: str = "64m"):
    return _mounted(target, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")


def _published(dist: Path) -> list[str]:
    return sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*"))


def _stage_and_publish(dist: Path, inputs: Path) -> Path:
    """The pipeline's staging (in a work folder beside `inputs`) and publish
    steps, on a tiny wheel."""
    pipeline.writable_folder(dist, "dist folder", "give another")
    pipeline.writable_folder(inputs / "work", "work folder", "give another")
    with pipeline.staged(inputs / "work") as staging:
        wheel = make_wheel(staging, "0.27.1+tpfix.3")
        sd, off = inputs / "sdist.tar.gz", inputs / "official.whl"
        extras = package.describe(
            wheel, BuildContext.resolve(get_line()), sd, off, "x86_64", "1", None
        )
        return package.publish(wheel, dist, extras)


@pytest.mark.slow  # a package stage (about a second)
@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_publish_into_a_mount_point(tmp_path: Path, kind: str):
    """dist/ is a mount point (a container volume, NFS, another disk):
    a rename from the work folder's staging fails with EXDEV, so each file is
    copied beside its place and renamed there; nothing else is left."""
    for name in ("sdist.tar.gz", "official.whl"):
        (tmp_path / name).write_bytes(b"stand-in")
    dist = tmp_path / "dist"
    if kind == "tmpfs":
        cm = _tmpfs(dist)
    else:
        (tmp_path / "elsewhere").mkdir()
        cm = _mounted(dist, "--bind", str(tmp_path / "elsewhere"))
    with cm:
        assert pipeline.mount_point(dist) == dist  # the bind mount too
        if kind == "tmpfs":  # another file system, not only another mount
            assert os.stat(dist).st_dev != os.stat(tmp_path).st_dev
        # the cross-device case is real: a rename from dist's parent is refused
        (tmp_path / "beside").write_text("x")
        with pytest.raises(OSError) as e:
            os.replace(tmp_path / "beside", dist / "beside")
        assert e.value.errno == errno.EXDEV
        wheel = _stage_and_publish(dist, tmp_path)
        expected = sorted(
            [wheel.name, *(wheel.name + s for s in SIDE), "SHA256SUMS"]
            + ["simple", "simple/index.html", "simple/vllm", "simple/vllm/index.html"]
        )
        assert _published(dist) == expected  # no staging folder, nothing hidden
        check_sums(dist)
        if kind == "bind":
            assert (tmp_path / "elsewhere" / wheel.name).exists()


def test_an_older_builds_staging_in_dist_is_removed_by_the_next(tmp_path: Path):
    dist = tmp_path / "dist"
    (dist / ".staging-4242-abc").mkdir(parents=True)
    (dist / ".staging-4242-abc" / "part.whl").write_bytes(b"half")
    (dist / "keep.txt").write_text("not ours to remove")
    package.clear_staging(dist)
    assert sorted(p.name for p in dist.iterdir()) == ["keep.txt"]


_KILLED_AT_THE_RENAME = """
import os, signal, sys
from pathlib import Path
from tpfix.stages import package
os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)  # kill -9 at the rename
package.write_sums(Path(sys.argv[1]), [Path(sys.argv[2])])
"""


def test_a_write_killed_at_its_rename_leaves_nothing_after_the_next_build(tmp_path: Path):
    """A kill -9 between writing SHA256SUMS's temporary file and renaming it
    (a real SIGKILL in a child): the next build's clear_staging removes the
    temporary file, in dist/ and in the folders SHA256SUMS lists."""
    dist = tmp_path / "dist"
    (dist / "image").mkdir(parents=True)
    (dist / "keep.txt").write_text("published")
    (dist / "image" / "a.json").write_text("{}")
    package.write_sums(dist, [Path("keep.txt"), Path("image/a.json")])
    sums = (dist / "SHA256SUMS").read_text()
    for folder, name in ((dist, "keep.txt"), (dist / "image", "a.json")):
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED_AT_THE_RENAME, str(folder), name],
            env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
        )
        assert proc.returncode == -signal.SIGKILL
    left = sorted(p.relative_to(dist).as_posix() for p in dist.rglob(".*partial-*"))
    assert [p.split(".partial-")[0] for p in left] == [".SHA256SUMS", "image/.SHA256SUMS"]
    package.clear_staging(dist)
    assert not list(dist.rglob(".*partial-*"))
    assert (dist / "SHA256SUMS").read_text() == sums  # the published files stay
    assert sorted(p.name for p in dist.rglob("*")) == ["SHA256SUMS", "a.json", "image", "keep.txt"]


_KILLED_SAVING_THE_LIST = """
import os, signal, sys
from pathlib import Path
from tpfix.image import image_engine
def killed(cmd, **kw):  # the engine has written part of the layout: kill -9
    layout = Path(cmd[-1].split(":")[1])
    (layout / "blobs").mkdir(parents=True)
    (layout / "blobs" / "part").write_bytes(b"half a layer")
    os.kill(os.getpid(), signal.SIGKILL)
image_engine.run = killed
eng = image_engine.Engine("buildah", "buildah")
image_engine.save_list(eng, "t:1", Path(sys.argv[1]) / "image" / "t-1.oci.tar", 0)
"""


@pytest.mark.parametrize("via", ["clear_staging", "tpfix.image"])
def test_an_image_archive_killed_midway_leaves_nothing_after_the_next_run(tmp_path, via):
    """A kill -9 while the manifest list's OCI layout is being written (a real
    SIGKILL in a child; the engine is simulated) into a dist whose
    SHA256SUMS lists no image file yet: the next build's clear_staging (which
    pipeline._prepare_folders runs before any work), or the next image run,
    removes the partial layout from dist/image/."""
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "keep.txt").write_text("published")
    package.write_sums(dist, [Path("keep.txt")])
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_SAVING_THE_LIST, str(dist)],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
    )
    assert proc.returncode == -signal.SIGKILL
    (left,) = (dist / "image").iterdir()
    assert left.name.startswith(".t-1.oci.tar.partial-") and left.is_dir()
    if via == "clear_staging":
        package.clear_staging(dist)
    else:  # python -m tpfix.image: it stops at the missing wheel, after clearing
        proc = subprocess.run(
            [sys.executable, "-m", "tpfix.image", "--dist", str(dist), "--engine", "buildah"],
            text=True,
            capture_output=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
        )
        assert proc.returncode != 0 and "vllm wheels" in proc.stderr, proc.stderr
    assert list((dist / "image").iterdir()) == []
    assert sorted(p.name for p in dist.iterdir()) == ["SHA256SUMS", "image", "keep.txt"]


# A build from another checkout (or an older tpfix): its lock file is not in
# this checkout's build/dists, but it holds the dist folder itself.
_OTHER_CHECKOUT = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
os.mkdir(os.path.join(sys.argv[1], ".staging-1-other"))
print("locked", flush=True)
time.sleep(300)
"""


def test_a_build_from_another_checkout_into_the_same_dist_is_refused(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    dist = tmp_path / "dist"
    dist.mkdir()
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_CHECKOUT, str(dist)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout.readline() == "locked\n"
        proc = run_pipeline(repo, dist, tmp_path / "w")
        assert proc.returncode == 2, proc.stderr
        assert f"error: dist folder {dist} is in use by another build" in proc.stderr
        assert "./build.sh --dist DIR" in proc.stderr and "Traceback" not in proc.stderr
        assert (dist / ".staging-1-other").is_dir()  # its staging folder is left alone
    finally:
        other.kill()
        other.wait()


def _only_error_line(err: str) -> str:
    assert "Traceback" not in err and "==> fetch" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith("error: "), err
    return line


def test_read_only_dist_or_parent_is_refused_before_any_download(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    ro = tmp_path / "ro"
    (tmp_path / "src" / "dist").mkdir(parents=True)
    with _mounted(ro, "--bind", str(tmp_path / "src")):
        _mount(ro, "-o", "remount,ro,bind")
        with pytest.raises(OSError):
            (ro / "probe").write_text("a read-only mount")
        for dist, cause in ((ro / "dist", ""), (ro / "new" / "dist", f": {ro / 'new'}")):
            proc = run_pipeline(
                repo,
                dist,
                tmp_path / "work",
                env={"PIP_NO_INDEX": "1"},
                cache=tmp_path / "cache",
            )
            assert proc.returncode == 2, proc.stderr
            line = _only_error_line(proc.stderr)
            assert f"dist folder {dist} is not writable (Read-only file system{cause});" in line
            assert "./build.sh --dist DIR" in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.whl"))


def test_too_little_space_is_refused_before_any_download(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    with _tmpfs(tmp_path / "small", "8m") as small:
        dist = small / "dist"
        proc = run_pipeline(
            repo,
            dist,
            tmp_path / "work",
            env={"PIP_NO_INDEX": "1"},
            cache=tmp_path / "cache",
        )
        assert proc.returncode == 2, proc.stderr
        line = _only_error_line(proc.stderr)
        assert "not enough free space" in line
        need = f"{pipeline.DIST_SPACE / 10**9:.2f} GB"
        assert f"dist folder {dist}: a build needs {need} on the file system at {small}" in line
        assert "0.01 GB free" in line
        assert f"{pipeline.SPACE_CHECK_ENV}=0" in line
        assert str(tmp_path / "work") not in line  # that one has room
        assert not dist.exists()  # a failed pre-check leaves no folder it created
        # the operator's override: past the check, to the first download
        proc = run_pipeline(
            repo,
            dist,
            tmp_path / "work",
            env={"PIP_NO_INDEX": "1", pipeline.SPACE_CHECK_ENV: "0"},
            cache=tmp_path / "cache",
        )
        assert proc.returncode == 2, proc.stderr
        assert "not enough free space" not in proc.stderr
        assert f"vllm=={get_line().tag[1:]} is not available" in proc.stderr  # the default line
        # its staging folder is gone again, and so is the dist folder it created
        assert not dist.exists()
        assert not any((repo / "build" / "dists").glob("dist-*"))


def _fill(path: Path) -> None:
    with open(path, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
            f.flush()


@pytest.mark.slow  # a package stage (about a second)
def test_a_full_disk_mid_publish_is_one_error_naming_the_file_system(tmp_path: Path):
    for name in ("sdist.tar.gz", "official.whl"):
        (tmp_path / name).write_bytes(b"stand-in")
    work = tmp_path / "work"
    work.mkdir()
    with _tmpfs(tmp_path / "dist", "4m") as dist:
        with (
            pytest.raises(Fail) as e,
            pipeline.space_errors(work, dist),
            pipeline.staged(work) as staging,
        ):
            wheel = make_wheel(staging, "0.27.1+tpfix.3")
            sd, off = tmp_path / "sdist.tar.gz", tmp_path / "official.whl"
            extras = package.describe(
                wheel, BuildContext.resolve(get_line()), sd, off, "x86_64", "1", None
            )
            _fill(dist / "filler")  # the disk fills up meanwhile
            package.publish(wheel, dist, extras)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith("no space left on device")
        assert f"dist folder {dist}: a build needs" in msg and f"file system at {dist}" in msg
        assert f"work folder {work}: a build needs" in msg
        assert not list(dist.glob(".*"))  # no partial copy left


def test_a_full_work_file_system_during_setup_py_names_the_staged_file(tmp_path: Path, monkeypatch):
    """setup.py (a stand-in: it fills its output folder, the staging folder in
    the work folder, and says only "No space left on device", as setuptools
    may) on a full work file system: the error names a file there and the
    work folder's need; dist/ (elsewhere, with room) is untouched."""
    from tpfix.stages import build

    def setup_py(cmd, **kwargs):
        # cmd: python -c _SETUP plat OUT cuda; unbuffered: nothing left to flush
        part = Path(cmd[4]) / "vllm.whl.part"
        with open(part, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        return subprocess.CompletedProcess(cmd, 1, "", "error: [Errno 28] No space left on device")

    monkeypatch.setattr(build, "run", setup_py)
    dist = tmp_path / "dist"
    dist.mkdir()
    with _tmpfs(tmp_path / "work", "4m") as work:
        tree = work / "tree.x"
        tree.mkdir()
        with (
            pytest.raises(Fail) as e,
            pipeline.space_errors(work, dist),
            pipeline.staged(work) as staging,
        ):
            official = tmp_path / "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"
            build.build_wheel(
                tree, "0.27.1+tpfix.3", official, "x86_64", staging, 1, tmp_path / "log", "12.9"
            )
        msg = str(e.value)
        assert msg.startswith(f"no space left on device writing {work}/"), msg
        assert f"work folder {work}: a build needs" in msg, msg
    assert list(dist.iterdir()) == []


@pytest.mark.slow  # downloads (the pinned sdist and wheel), patches and starts setup.py
def test_a_full_work_disk_mid_build_is_one_error_line(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    """Past the up-front check (skipped), the tree and setup.py's output fill
    a small work file system: one `error:` line, no setuptools text."""
    with _tmpfs(tmp_path / "small", "200m") as small:
        work = small / "work"
        proc = run_pipeline(
            repo,
            tmp_path / "dist",
            work,
            "--no-cache",  # a real tree and setup.py, not the cached wheel
            env={pipeline.SPACE_CHECK_ENV: "0"},
        )
        assert proc.returncode == 2, proc.stderr
        assert "==> patch" in proc.stderr  # it got as far as writing the tree
        errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith(("==> ", "fetch: "))]
        assert len(errors) == 1 and errors[0].startswith("error: no space left on device"), errors
        need = f"{pipeline.WORK_SPACE / 10**9:.2f} GB"
        assert (
            f"work folder {work}: a build needs {need} on the file system at {small}" in (errors[0])
        )
        assert not list(work.glob("tree.*"))
        assert not (tmp_path / "dist").exists()  # the empty dist it created is gone too


@pytest.mark.slow  # downloads the pinned sdist (pip)
def test_a_full_download_cache_is_one_error_line_naming_it(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    with _tmpfs(tmp_path / "cache", "20m") as cache:  # the sdist alone is 39 MB
        proc = run_pipeline(
            repo,
            tmp_path / "dist",
            tmp_path / "work",
            cache=cache,
        )
        assert proc.returncode == 2, proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith(("==> ", "fetch: "))]
        assert len(errors) == 1 and errors[0].startswith("error: no space left on device"), errors
        assert f"(its file system at {cache}: " in errors[0]
        assert "set VLLM_DIST_CACHE to a download cache on another file system" in errors[0]
        assert not list((cache / "sha256").glob("*/*"))


# A stand-in for upstream's setup.py: says it runs, then keeps running.
_SETUP_PY = """
import os, time
open("child.pid", "w").write(str(os.getpid()))
time.sleep(120)
"""

_BUILD_STAGE = """
import sys
from pathlib import Path
from tpfix.stages.build import build_wheel
tree, out = Path(sys.argv[1]), Path(sys.argv[2])
official = out / "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"
build_wheel(tree, "0.27.1+tpfix.3", official, "x86_64", out, "1", out / "log", "12.9")
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped


def test_kill_9_of_a_build_leaves_no_setup_py_behind(tmp_path: Path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    tree.mkdir()
    out.mkdir()
    (tree / "setup.py").write_text(_SETUP_PY)
    stage = subprocess.Popen([sys.executable, "-c", _BUILD_STAGE, str(tree), str(out)])
    pid_file = tree / "child.pid"
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()):
        assert stage.poll() is None and time.monotonic() < deadline, "setup.py never started"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _alive(child)
    try:
        stage.send_signal(signal.SIGKILL)
        stage.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"setup.py (pid {child}) outlived the killed build"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
