# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What every stage of the distribution pipeline shares that is not data:
the repository root, the error type, hashing and atomic writes, the download
cache and its locks, child processes, git facts, URL scrubbing, argparse
helpers, signals and the main() wrapper.

Every stage (fetch -> patch -> build -> verify -> package) raises `Fail` with a
message that names the file at fault and the fix; `main_wrapper` prints it
and exits 2 without a traceback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


class Fail(Exception):
    """A pipeline error meant for the user: the message says what and how to fix."""


def cache_dir() -> Path:
    """Download cache shared by builds and tests, keyed by sha256."""
    env = os.environ.get("VLLM_DIST_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "vllm-dist"
    return base


@contextlib.contextmanager
def cache_lock(name: str):
    """Serialise the creation of one cache entry across threads and processes."""
    path = cache_dir() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def host_arch() -> str:
    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)


def shown(path: Path) -> str:
    """`path` as messages name it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sdist_text(sdist: Path, rel: str) -> str | None:
    """The text of the file `rel` (e.g. requirements/cuda.txt) under the
    top folder of the sdist `sdist`, or None where it has none."""
    with tarfile.open(sdist) as tar:
        member = next((m for m in tar.getmembers() if m.name.partition("/")[2] == rel), None)
        return None if member is None else tar.extractfile(member).read().decode()


def free_bytes(folder: Path) -> int:
    """Free bytes for an unprivileged writer on `folder`'s file system."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def link_or_copy(src: Path, dest: Path) -> None:
    """`dest` as a hard link to `src` (no copy on one file system), else a copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


# The temporary file of write_atomic, `.<name>.partial-<random>`: a kill
# before its rename leaves it (the next build's package.clear_staging removes it).
PARTIAL = ".partial-"


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `path` atomically (a temporary file beside it, then os.replace):
    a reader sees the old file or the new one, never part of it."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{PARTIAL}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with(parent: int) -> None:
    """In the child, before exec: the kernel kills it (SIGKILL) when the
    thread that started it dies, `kill -9` included, so that no setup.py,
    pip or quilt keeps writing into a tree nobody owns any more."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def child_options() -> dict:
    """The subprocess keyword arguments that tie a child's life to this process
    (Linux; elsewhere none).  Every stage starts its commands with them,
    through run() or subprocess.run(cmd, **child_options()).

    PR_SET_PDEATHSIG covers the child itself, not what it starts in turn; a
    child that has to outlive a call is not started with these."""
    if not sys.platform.startswith("linux"):
        return {}
    import functools

    return {"preexec_fn": functools.partial(_die_with, os.getpid())}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, capture_output=True, **child_options(), **kw)


def git(*args: str) -> str:
    """`git -C ROOT ARGS`'s output, empty where git fails (no git, no repository)."""
    proc = run(["git", "-C", str(ROOT), *args])
    return proc.stdout.strip() if proc.returncode == 0 else ""


def revision() -> str:
    """HEAD of this repository, `-dirty` with uncommitted changes to tracked files."""
    head = git("rev-parse", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if dirty else "")


def public_url(url: str) -> str:
    """`url` fit to publish: a network URL without user, password, query or
    fragment (they may hold a token), an scp-style git remote as ssh://; empty
    for anything else (a local path or file URL would name this machine)."""
    from urllib.parse import urlsplit, urlunsplit

    url = url.strip()
    scp = re.fullmatch(r"(?:[^@/:]+@)?([A-Za-z0-9.-]+):(?!//)([^\\]+)", url)
    if scp and "://" not in url:
        return f"ssh://{scp.group(1)}/{scp.group(2).lstrip('/')}"
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "ssh", "git") or not parts.hostname:
        return ""
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def source_url() -> str:
    """The `origin` remote as public_url() publishes it, empty without one."""
    return public_url(git("remote", "get-url", "origin"))


def add_sign_arg(ap) -> None:
    """--sign-key, for ./build.sh and tpfix.image.image (resolved by attest.signing_key)."""
    ap.add_argument(
        "--sign-key",
        type=Path,
        help="PEM private key: also sign the provenance (<artifact>.intoto.jsonl); "
        "default $TPFIX_SIGNING_KEY (see scripts/tpfix/release/attest.py)",
    )


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """Let SIGTERM unwind like Ctrl-C, so that the `finally` clean-ups run and
    main_wrapper reports the interruption (for commands that write folders)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


def main_wrapper(fn) -> None:
    try:
        fn()
    except Fail as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: nothing was left half-written", file=sys.stderr)
        sys.exit(130)
