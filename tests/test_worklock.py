# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""One build per folder (tpfix/core/worklock.py), unit by unit: hold, workdir_lock,
hold_folder, dist_lock, holder_text and describe_holder, against a holder in
another process (a small Python child holding the lock and sleeping).

A second holder is refused at once with a Fail naming the folder, the
holder's pid and command and the fix; the lock is free again once the holder
leaves its block, exits or is SIGKILLed (the kernel drops the flock), while
the text a killed holder left never blocks; the lock file holds who holds it
(pid, host, start, cwd, command, one line each); a lock file whose text says
nothing still blocks (the text is for the message only); two folders never
block each other; an output folder is guarded by its lock file under
build/dists/ and by a flock on the folder itself (another checkout's build).
The pipeline-level version (./build.sh's locks) is in test_bad_input.py.
Paths under build/dists/ go to tmp_path (lines.ROOT monkeypatched, here and
in the child).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpfix.core import lines
from tpfix.core.lines import dist_state
from tpfix.core.util import ROOT, Fail
from tpfix.core.worklock import describe_holder, dist_lock, hold, holder_text, workdir_lock

# The other holder: takes the lock KIND (hold, workdir, dist) on PATH with its
# build/dists/ under ROOT, says "locked", leaves the block at a line on its
# stdin, says "released" and exits at the next line (or at the end of stdin).
_HOLDER = """
import sys
from pathlib import Path
from tpfix.core import lines, worklock
kind, path, root = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
lines.ROOT = root
if kind == "hold":
    lock = worklock.hold(path, f"folder {path.parent}", "use another folder")
elif kind == "workdir":
    lock = worklock.workdir_lock(path)
else:
    lock = worklock.dist_lock(path)
with lock:
    print("locked", flush=True)
    sys.stdin.readline()
print("released", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def holders(tmp_path: Path, monkeypatch):
    """A starter of holders, called as (kind, path[, root]); each is killed
    and waited for at the end.  lines.ROOT is tmp_path/root here too."""
    monkeypatch.setattr(lines, "ROOT", tmp_path / "root")
    started: list[subprocess.Popen] = []

    def start(kind: str, path: Path, root: Path | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, kind, str(path), str(root or tmp_path / "root")],
            env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        line = proc.stdout.readline()
        assert line == "locked\n", (line, proc.poll())
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                f.close()


def _try_in_child(kind: str, path: Path, root: Path) -> subprocess.CompletedProcess:
    """The holder, run to its end (its stdin empty: it leaves its block at once)."""
    return subprocess.run(
        [sys.executable, "-c", _HOLDER, kind, str(path), str(root)],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _fields(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.splitlines())


def _refused(lock) -> str:
    """The message of the Fail that taking `lock` raises, checked to come at once."""
    t0 = time.monotonic()
    with pytest.raises(Fail) as e, lock:
        pytest.fail("the lock was taken while another process holds it")
    assert time.monotonic() - t0 < 1.5, "refused only after waiting"
    return str(e.value)


def test_a_second_holder_is_refused_naming_folder_pid_command_and_fix(tmp_path: Path, holders):
    work = tmp_path / "work"
    first = holders("workdir", work)
    said = _refused(workdir_lock(work))
    assert said.startswith(f"work folder {work} is in use by another build: pid {first.pid} ")
    assert f" on {socket.gethostname()}, started 20" in said
    assert "\n  command: " in said and "worklock.workdir_lock" in said  # the holder's code
    assert f"lock: {work / '.lock'}" in said
    assert said.endswith(
        "Wait until that build has finished, or give this build its own: "
        "./build.sh --workdir DIR --dist DIR."
    )
    # refused again, also from another process; the holder's text is left as it was
    again = _try_in_child("workdir", work, tmp_path / "root")
    assert again.returncode == 1 and "locked" not in again.stdout
    assert f"Fail: work folder {work} is in use by another build: pid {first.pid}" in again.stderr
    assert _fields((work / ".lock").read_text())["pid"] == str(first.pid)
    assert first.poll() is None


def test_hold_names_the_folder_and_the_fix_it_is_given(tmp_path: Path, holders):
    lock = tmp_path / "state" / "lock"
    first = holders("hold", lock)
    said = _refused(hold(lock, "the cache X", "run with --cache elsewhere"))
    assert said.startswith(f"the cache X is in use by another build: pid {first.pid} ")
    assert said.endswith(
        f"(lock: {lock}). Wait until that build has finished, or run with --cache elsewhere."
    )


def test_the_lock_is_free_once_the_holder_leaves_its_block(tmp_path: Path, holders):
    work = tmp_path / "work"
    first = holders("workdir", work)
    first.stdin.write("go\n")
    first.stdin.flush()
    assert first.stdout.readline() == "released\n"
    assert first.poll() is None  # still running, but out of its block
    assert (work / ".lock").read_text() == ""  # held by nobody
    with workdir_lock(work):
        assert _fields((work / ".lock").read_text())["pid"] == str(os.getpid())
    assert (work / ".lock").exists() and (work / ".lock").read_text() == ""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_lock_of_a_killed_holder_is_free_and_taken_again(tmp_path: Path, holders, sig):
    work = tmp_path / "work"
    first = holders("workdir", work)
    _refused(workdir_lock(work))
    first.send_signal(sig)
    assert first.wait(timeout=30) == -sig
    stale = (work / ".lock").read_text()
    assert _fields(stale)["pid"] == str(first.pid)  # its text stays, and does not count
    with workdir_lock(work):
        now = (work / ".lock").read_text()
        assert _fields(now)["pid"] == str(os.getpid())
        assert f"pid: {first.pid}\n" not in now  # replaced, not appended to
        # another process is refused, naming this one
        again = _try_in_child("workdir", work, tmp_path / "root")
        assert again.returncode == 1 and "locked" not in again.stdout
        assert f"in use by another build: pid {os.getpid()} " in again.stderr
    # taken again by another process once this one let go
    third = holders("workdir", work)
    assert _fields((work / ".lock").read_text())["pid"] == str(third.pid)


def test_a_lock_file_that_names_nobody_still_blocks(tmp_path: Path):
    """A holder that flocked the file but wrote nothing (yet): refused all the
    same, the message says the file does not say which build."""
    lock = tmp_path / "lock"
    code = (
        "import fcntl, sys, time\n"
        f"f = open({str(lock)!r}, 'w'); f.write('half a line'); f.flush()\n"
        "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "locked\n"
        t0 = time.monotonic()
        with pytest.raises(Fail) as e, hold(lock, "folder F", "use another"):
            pytest.fail("taken while flocked")
        assert time.monotonic() - t0 < 10  # waited a moment for the text, no more
        assert str(e.value).startswith(
            "folder F is in use by another build (its lock file does not say which)\n"
        )
        assert lock.read_text() == "half a line"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_the_holder_text_as_written(tmp_path: Path, holders):
    lock = tmp_path / "lock"
    with hold(lock, "folder F", "use another"):
        text = lock.read_text()
    assert lock.read_text() == ""  # held by nobody once out of the block
    assert text.endswith("\n") and [ln.split(": ")[0] for ln in text.splitlines()] == [
        "pid",
        "host",
        "started",
        "cwd",
        "command",
    ]
    info = _fields(text)
    assert info["pid"] == str(os.getpid()) and info["host"] == socket.gethostname()
    assert info["cwd"] == os.getcwd()
    started = time.mktime(time.strptime(info["started"], "%Y-%m-%d %H:%M:%S %z"))
    assert abs(started - time.time()) < 120
    # what `ps` shows (xdist's workers set a process title: empty arguments dropped)
    argv = [a for a in Path("/proc/self/cmdline").read_bytes().decode().split("\0") if a]
    assert shlex.split(info["command"]) == argv and argv
    # the other holder's: its own pid, and its multi-line -c command on one line
    other = tmp_path / "other.lock"
    first = holders("hold", other)
    theirs = other.read_text()
    assert theirs.count("\n") == 5
    info = _fields(theirs)
    assert info["pid"] == str(first.pid) and info["pid"] != str(os.getpid())
    argv = shlex.split(info["command"])
    assert argv[0] == sys.executable and argv[1] == "-c"
    assert argv[2] == _HOLDER.replace("\n", "\\n")
    assert argv[3:] == ["hold", str(other), str(tmp_path / "root")]
    assert holder_text().startswith(f"pid: {os.getpid()}\nhost: ")


def test_describe_holder():
    assert describe_holder({}) == "another build (its lock file does not say which)"
    assert describe_holder({"host": "h"}) == "another build (its lock file does not say which)"
    assert describe_holder({"pid": "12"}) == "another build: pid 12"
    full = {"pid": "12", "host": "h", "started": "S", "cwd": "/c", "command": "x y"}
    assert describe_holder(full) == "another build: pid 12 on h, started S, in /c\n  command: x y"


def test_two_folders_do_not_block_each_other(tmp_path: Path, holders):
    a, b = tmp_path / "a", tmp_path / "b"
    holders("workdir", a)
    holders("dist", tmp_path / "dist-a")
    with workdir_lock(b), dist_lock(tmp_path / "dist-b"):
        assert _fields((b / ".lock").read_text())["pid"] == str(os.getpid())
        # a work folder and a dist folder of the same path are two locks
        with workdir_lock(tmp_path / "dist-a"):
            pass
    _refused(workdir_lock(a))
    _refused(dist_lock(tmp_path / "dist-a"))


def test_an_output_folder_is_refused_naming_it(tmp_path: Path, holders):
    dist = tmp_path / "dist"
    first = holders("dist", dist)
    said = _refused(dist_lock(dist, fix="use --dist ELSEWHERE"))
    assert said.startswith(f"dist folder {dist} is in use by another build: pid {first.pid} ")
    assert f"(lock: {dist_state(dist) / 'lock'})" in said
    assert said.endswith("or use --dist ELSEWHERE.")
    assert dist_state(dist).parent == tmp_path / "root" / "build" / "dists"
    assert f"{dist}/" not in said  # the lock is not inside dist/
    assert not any(dist.iterdir()), "dist/ holds published files only"
    # another spelling of the same folder is the same lock
    (tmp_path / "link").symlink_to(tmp_path)
    assert f"dist folder {dist} is in use" in _refused(dist_lock(tmp_path / "link" / "dist"))


def test_an_output_folder_held_from_another_checkout_is_refused(tmp_path: Path, holders):
    """Another checkout's build keeps its lock file under its own build/dists/:
    the flock on the folder itself refuses it."""
    dist = tmp_path / "dist"
    holders("dist", dist, root=tmp_path / "other-checkout")
    assert not (tmp_path / "root").exists()  # no lock file of ours: only the folder's flock
    said = _refused(dist_lock(dist))
    assert said.startswith(f"dist folder {dist} is in use by another build, one whose lock file")
    assert "another checkout's build" in said and said.endswith("./build.sh --dist DIR.")
    # the refused build leaves no state folder of its own behind
    assert not dist_state(dist).exists()


def test_an_unused_output_folder_and_its_state_are_removed(tmp_path: Path, holders):
    dist, kept = tmp_path / "dist", tmp_path / "kept"
    with dist_lock(dist):
        assert dist.is_dir() and (dist_state(dist) / "lock").exists()
    assert not dist.exists() and not dist_state(dist).exists()
    with dist_lock(kept):
        (kept / "published.whl").write_text("w")
    assert (kept / "published.whl").exists() and (dist_state(kept) / "lock").exists()
