# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""One build per work folder: an exclusive lock, held for the whole run.

A build owns its work folder (`build/work`: the patched tree, logs) and its
output folder (`dist/`, with its hidden staging folder) from its first
step to its last.  Without a lock, a second `./build.sh` in the same checkout
removed the first one's tree as "left by a killed run", and the first then
failed with a misleading "patch does not apply".  So `hold()` takes an
exclusive `fcntl.flock` on a lock file in the folder and keeps it until the
run ends; clean-up of what a killed run left happens only while holding it.
The output folder's lock file lives under this checkout's build/dists/
(lines.dist_state: dist/ holds published files only, its parent may be
read-only); the folder itself is flocked too, so that a build from another
checkout into the same dist/ is refused as well (where the file system
allows flock on a folder; NFS does not, and there only the lock file counts).

**Stop, don't wait.**  A second build on a folder in use stops at once with
the other build's pid, host, start time and command line, and what to do.
Waiting was the other choice, and it is worse here: a build takes minutes, so
a waiting one looks hung; a second run into the same folders only redoes the
same work (the build is reproducible) and then replaces the first one's
output, so it is nearly always started by mistake, or wants its own output
(`--workdir`/`--dist` elsewhere, which never waits); and whoever wants to wait
can run the two one after the other.

**A killed build never blocks.**  The kernel releases a flock when the
process holding it dies, however it dies (`kill -9` included), so the lock
file a killed build leaves behind is free and the next build takes it.  The
file's text (who holds it) is only for the message, never for the decision:
no pid-file heuristics.  The lock file itself is never removed: removing it
while another build has it open would let two builds lock two different files.
The descriptor is not inherited by child processes (PEP 446), so a child left
running by a killed build does not keep the lock either.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tpfix.core.lines import dist_state
from tpfix.core.util import Fail


def _command_line() -> str:
    try:  # what `ps` shows: `python -m tpfix.pipeline ...`, not the module's file
        raw = Path("/proc/self/cmdline").read_bytes()
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    except OSError:
        argv = [sys.executable, *sys.argv]
    return shlex.join(argv).replace("\n", "\\n")  # one line in the lock file


def holder_text() -> str:
    """What this process writes into a lock file it holds."""
    started = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime())
    return (
        f"pid: {os.getpid()}\n"
        f"host: {socket.gethostname()}\n"
        f"started: {started}\n"
        f"cwd: {os.getcwd()}\n"
        f"command: {_command_line()}\n"
    )


def _read_holder(fd: int) -> dict[str, str]:
    # The holder writes its text right after taking the lock: give it a moment.
    deadline = time.monotonic() + 2.0
    while True:
        text = os.pread(fd, 1 << 16, 0).decode(errors="replace")
        if text.endswith("\n") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    info = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            info[key] = value
    return info


def describe_holder(info: dict[str, str]) -> str:
    if "pid" not in info:
        return "another build (its lock file does not say which)"
    where = f" on {info['host']}" if info.get("host") else ""
    text = f"another build: pid {info['pid']}{where}"
    if info.get("started"):
        text += f", started {info['started']}"
    if info.get("cwd"):
        text += f", in {info['cwd']}"
    if info.get("command"):
        text += f"\n  command: {info['command']}"
    return text


@contextlib.contextmanager
def hold(lock_file: Path, folder: str, fix: str) -> Iterator[None]:
    """Hold an exclusive flock on `lock_file` for the duration of the block.

    Raises Fail at once when another process holds it: the message names the
    `folder` the lock guards, the other build (from the lock file's text) and
    `fix`, what to do instead.
    """
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        # O_RDWR without O_TRUNC: the holder's text must survive our open.
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise Fail(
            f"{folder}: cannot create its lock file {lock_file} ({e.strerror}); "
            f"make {lock_file.parent} writable, or {fix}"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_holder(_read_holder(fd))
            raise Fail(
                f"{folder} is in use by {holder}\n"
                f"Only one build at a time may use a folder (lock: {lock_file}). "
                f"Wait until that build has finished, or {fix}."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_text().encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # held by nobody now (the file itself stays)
    finally:
        os.close(fd)  # releases the flock


def workdir_lock(workdir: Path):
    """The lock of a build's work folder (the patched tree, logs)."""
    return hold(
        workdir / ".lock",
        f"work folder {workdir}",
        "give this build its own: ./build.sh --workdir DIR --dist DIR",
    )


@contextlib.contextmanager
def hold_folder(folder: Path, what: str, fix: str) -> Iterator[None]:
    """An exclusive flock on `folder` itself (created if it can be), for the
    block; none where the folder cannot be opened (the build's own check then
    names it) or the file system has no flock on folders (NFS)."""
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Fail(
                f"{what} is in use by another build, one whose lock file is not in "
                f"this checkout's build/dists/ (another checkout's build, or an older "
                f"tpfix). Only one build at a time may use a folder. Wait until that "
                f"build has finished, or {fix}."
            ) from None
        except OSError:
            pass  # no flock on folders here: the lock file alone guards it
        yield
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def dist_lock(
    dist: Path, fix: str = "give this build its own output folder: ./build.sh --dist DIR"
) -> Iterator[None]:
    """The lock of an output folder: its lock file under build/ (lines.dist_state:
    dist/ holds published files only), then the folder itself."""
    dist = dist.resolve()
    what = f"dist folder {dist}"
    state = dist_state(dist)
    created = [p for p in (dist, state) if not p.exists()]
    entered = False
    with hold(state / "lock", what, fix):
        try:
            with hold_folder(dist, what, fix):
                entered = True
                yield
        finally:
            # A build that published nothing (a failed pre-check, or refused
            # by another checkout's flock on dist/) leaves no folder it
            # created: an empty dist/, its state folder with the lock.
            with contextlib.suppress(OSError):
                if dist in created:
                    dist.rmdir()  # only if empty
                if state in created and (not entered or not dist.exists()):
                    if [p.name for p in state.iterdir()] == ["lock"]:
                        (state / "lock").unlink()
                    state.rmdir()
