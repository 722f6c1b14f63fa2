# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The whole job behind ./build.sh: fetch -> verify -> patch -> build -> verify -> package.

    ./build.sh                      # wheel for this machine's arch into dist/
    ./build.sh --arch aarch64       # the other official arch (nothing compiles)
    ./build.sh --arch all           # each arch the line pins, into one dist
    ./build.sh --dist DIR           # somewhere else than dist/
    ./build.sh --line v0.33.0       # another release line (patches/v0.33.0/) into dist/v0.33.0/
    ./build.sh --no-cache           # build even when nothing changed (wheel_cache)
    ./build.sh --image [...]        # then the container image (scripts/tpfix/image/image.py)
    ./build.sh --arch all --image   # an image per arch and a manifest list over them

Work happens under the work folder (build/work: a fresh patched tree per
run, logs, and the staging folder `staging-<pid>-*`), never in dist/, so a
server publishing dist/ never serves a half-made or a killed build's file;
publishing is a rename from there, or a copy and a rename where dist is on
another file system (a mount point, NFS, a container volume).  dist/ only
ever receives a verified wheel, and only files a build of this project
listed in its SHA256SUMS are ever removed from it.

Before any download the build checks that it can write its work and dist
folders and that their file systems have the room a build needs
(WORK_SPACE, DIST_SPACE; TPFIX_SPACE_CHECK=0 skips the check); a full disk
later still ends in one `error:` line naming the file system.

One build per folder: a run holds an exclusive lock on its work folder
(`<workdir>/.lock`) and on its dist folder (build/dists/<name>-<hash>/lock,
lines.dist_state, so that dist/ holds published files only and its parent
may be read-only, and a flock on the folder itself for builds of other
checkouts) from start to end, image stage included.  A second build on
either stops at once, naming the first (pid, start time, command line); it
does not wait (why: tpfix/core/worklock.py).  What a killed run left behind
(`<workdir>/tree.*`, `<workdir>/staging-*`) is removed only while holding both.
The commands a build runs (setup.py, pip, quilt, ...) die with it, `kill -9`
included (util.child_options).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tpfix.core.context import BuildContext, Release
from tpfix.core.lines import bump_command, changelog_entries, get_line, line_names, wheel_arches
from tpfix.core.util import (
    Fail,
    add_sign_arg,
    free_bytes,
    host_arch,
    main_wrapper,
    shown,
    sigterm_as_interrupt,
)
from tpfix.core.worklock import dist_lock, workdir_lock
from tpfix.stages import wheel_cache
from tpfix.stages.build import build_wheel, source_date_epoch
from tpfix.stages.fetch import fetch_inputs
from tpfix.stages.package import STAGING, clear_staging, describe, other_arches, publish
from tpfix.stages.patch import patch_tree
from tpfix.stages.verify import verify_wheel


def _step(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


# What a build writes, measured: ./build.sh into an empty --workdir/--dist
# with the downloads cached, `du -sb` of both every second (2026-12-02):
#   v0.27.1 x86_64: work folder peak 2.33 GB (the patched tree, about 0.8 GB,
#     and setup.py's build/ with the official binaries, 1.4 GB), dist 0.31 GB
#     (the wheel 313 MB; SBOM, provenance, index ~0.1 MB), staging included;
#   v0.33.0 x86_64: work folder peak 2.61 GB, dist 0.34 GB.
# The staging folder has since moved into the work folder: its peak is the
# sum, 2.95 GB.  Needed free: the larger peak plus about 15% (a build's files
# grow with the release); dist needs the new wheel's room while the old one
# is still there (a copy, where dist is another file system).
WORK_SPACE = 34 * 10**8
DIST_SPACE = 5 * 10**8
SPACE_CHECK_ENV = "TPFIX_SPACE_CHECK"  # 0: build without checking free space first


def mounts() -> list[Path]:
    """This process's mount points (Linux: /proc/self/mountinfo; else none)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    # field 5, with space, tab, newline and backslash written as octal escapes
    raw = (ln.split()[4] for ln in text.splitlines() if len(ln.split()) > 4)
    return [Path(re.sub(r"\\([0-7]{3})", lambda e: chr(int(e[1], 8)), p)) for p in raw]


def mount_point(path: Path) -> Path:
    """The mount point that holds `path` (which exists), bind mounts included."""
    path = path.resolve()
    inside = [m for m in mounts() if path == m or m in path.parents]
    if inside:
        return max(inside, key=lambda m: len(m.parts))
    dev = path.stat().st_dev
    while not os.path.ismount(path) and path.parent.stat().st_dev == dev:
        path = path.parent
    return path


def _gb(n: int) -> str:
    return f"{n / 10**9:.2f} GB"


def space_needs(workdir: Path, dist: Path) -> list[tuple[Path, int, int, str]]:
    """(mount point, free bytes, bytes a build needs, which folders) for each
    file system the build writes to (one, when both folders share it)."""
    out: dict[int, list] = {}
    for folder, need, what in ((workdir, WORK_SPACE, "work"), (dist, DIST_SPACE, "dist")):
        dev = folder.stat().st_dev
        if dev in out:
            out[dev][2] += need
            out[dev][3] += f" and {what} folder {folder}"
        else:
            out[dev] = [
                mount_point(folder),
                free_bytes(folder),
                need,
                f"{what} folder {folder}",
            ]
    return [tuple(v) for v in out.values()]


def _space_text(needs) -> str:
    return "; ".join(
        f"{what}: a build needs {_gb(need)} on the file system at {mp}, {_gb(free)} free"
        for mp, free, need, what in needs
    )


def check_space(workdir: Path, dist: Path) -> None:
    """Stop before any download unless each file system has the room a build needs."""
    if os.environ.get(SPACE_CHECK_ENV, "1") == "0":
        return
    needs = space_needs(workdir, dist)
    short = [n for n in needs if n[1] < n[2]]
    if short:
        raise Fail(
            f"not enough free space: {_space_text(short)}; free some, or use --workdir/--dist "
            f"on another file system (or {SPACE_CHECK_ENV}=0 to build anyway)"
        )


@contextlib.contextmanager
def space_errors(workdir: Path, dist: Path):
    """A full disk anywhere in the block (ENOSPC, or setup.py saying so) ends
    in one Fail naming the file systems and the space a build needs."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        needs = space_needs(workdir, dist)
        where = other = ""
        if e.filename:
            where = f" writing {e.filename}"
            folder = Path(e.filename)
            while not folder.exists() and folder != folder.parent:
                folder = folder.parent
            if folder.is_absolute() and mount_point(folder) not in (n[0] for n in needs):
                # neither work's nor dist's: the download cache
                other = f" (its file system at {mount_point(folder)}: "
                other += f"{_gb(free_bytes(folder))} free)"
        fix = "use --workdir/--dist on another file system"
        if other:
            fix = "set VLLM_DIST_CACHE to a download cache on another file system"
        raise Fail(
            f"no space left on device{where}{other}: {_space_text(needs)} "
            f"(after this build's files were removed); free some, or {fix}"
        ) from None


def writable_folder(folder: Path, what: str, fix: str) -> None:
    """Create `folder` (and its parents) and check it takes files: Fail with
    one line naming it and `fix` where not (read-only mount, permissions)."""
    try:
        blocker = next((p for p in [folder, *folder.parents] if p.exists()), None)
        if blocker is not None and not blocker.is_dir():  # a file where a folder goes
            raise Fail(
                f"{what} {folder} cannot be made: {blocker} is a file, not a folder; "
                f"move that file away, or {fix}"
            )
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        where = Path(e.filename) if e.filename else folder
        where = folder if folder in (where, where.parent) else where  # else: a parent
        detail = e.strerror if where == folder else f"{e.strerror}: {where}"
        raise Fail(
            f"{what} {folder} is not writable ({detail}); make it writable "
            f"(a read-write mount, its owner or mode), or {fix}"
        ) from None


@contextlib.contextmanager
def staged(workdir: Path):
    """A fresh staging folder in the work folder, outside dist/ (publish moves
    from it), removed when the block ends, however it ends; a killed
    build's by the next (_prepare_folders)."""
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}-", dir=workdir))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def build_locks(workdir: Path, dist: Path):
    """Hold the work folder and the dist folder for one build (see worklock)."""
    with workdir_lock(workdir), dist_lock(dist):
        yield


# The Python packages the package stage needs (ci/requirements-build.lock).
TOOLS = {
    "cyclonedx": ("cyclonedx-python-lib", "the SBOM"),
    "in_toto_attestation": ("in-toto-attestation", "the provenance"),
    "securesystemslib": ("securesystemslib[crypto]", "signing the provenance"),
    "simple503": ("simple503", "the package index"),
}


def check_tools() -> None:
    """Stop before any download when a tool of the package stage is missing."""
    import importlib.util

    missing = [v for k, v in TOOLS.items() if importlib.util.find_spec(k) is None]
    if missing:
        names = ", ".join(f"{pkg} ({why})" for pkg, why in missing)
        raise Fail(
            f"missing in {sys.prefix}: {names}; ./build.sh installs them from "
            "ci/requirements-build.lock (or: pip install --require-hashes -r "
            "ci/requirements-build.lock)"
        )


def _prepare_folders(workdir: Path, dist: Path) -> Path:
    """Once per build, holding build_locks(workdir, dist): both folders take
    files, and what a killed run left in them is gone.  Returns dist, resolved."""
    dist = dist.resolve()
    writable_folder(workdir, "work folder", "give another: ./build.sh --workdir DIR")
    writable_folder(dist, "dist folder", "give another: ./build.sh --dist DIR")
    if dist == workdir.resolve() or dist in workdir.resolve().parents:
        raise Fail(
            f"work folder {workdir} is inside dist folder {dist}: a server publishing "
            "it would serve the build's tree; give another: ./build.sh --workdir DIR"
        )
    # Left by a killed run: no live build can own them, as we hold both locks.
    for stale in [*workdir.glob("tree.*"), *workdir.glob(STAGING + "*")]:
        shutil.rmtree(stale, ignore_errors=True)
    clear_staging(dist)
    return dist


def _run_locked(
    ctx: BuildContext, arch: str, dist: Path, workdir: Path, signer=None, cached: bool = True
) -> Release:
    """The build of `ctx` for `arch`; the caller holds build_locks(workdir, dist)
    and ran _prepare_folders.  Returns the published wheel with the facts of
    its build (for the image stage)."""
    check_space(workdir, dist)
    with space_errors(workdir, dist), staged(workdir) as staging:
        return _build(ctx, arch, dist, workdir, signer, staging, cached)


def _build(
    ctx: BuildContext,
    arch: str,
    dist: Path,
    workdir: Path,
    signer,
    staging: Path,
    cached: bool = True,
) -> Release:
    """Fetch, patch, build, verify and package into `staging`, then publish.
    With `cached`, a wheel built and verified from the same inputs before
    (wheel_cache.restore) stands in for patch, build and verify."""
    line = ctx.line
    _step(f"fetch + verify pins of {ctx.tag} (vllm sdist, official {arch} wheel)")
    sdist, official = fetch_inputs(ctx, arch)
    epoch = source_date_epoch(sdist)
    entry_key = wheel_cache.key(ctx, arch, epoch)  # the inputs, before any work
    wheel = wheel_cache.restore(line, arch, entry_key, staging, _step) if cached else None
    tree_parent = Path(tempfile.mkdtemp(prefix="tree.", dir=workdir))
    try:
        restored = wheel is not None
        if restored:
            _step(f"build: {wheel.name} as built and verified before (--no-cache: build again)")
        else:
            wheel = _build_and_verify(
                ctx, arch, workdir, staging, sdist, official, epoch, tree_parent
            )
        # What the cache key names and the SBOM and provenance describe: the
        # inputs as resolved, not as edited meanwhile.
        ctx.check_unchanged()
        if not restored:
            wheel_cache.store(line, arch, entry_key, wheel)
        _step("package: SBOM, provenance" + (" (signed)" if signer else "") + ", index")
        others = [dist / p for p in other_arches(dist, wheel)]
        extras = describe(wheel, ctx, sdist, official, arch, epoch, signer, others)
        _step(f"package into {dist}")
        final = publish(wheel, dist, extras, signer)
    finally:
        shutil.rmtree(tree_parent, ignore_errors=True)
    return Release(ctx, final, sdist, official, arch, epoch)


def _build_and_verify(
    ctx: BuildContext,
    arch: str,
    workdir: Path,
    staging: Path,
    sdist: Path,
    official: Path,
    epoch: int,
    tree_parent: Path,
) -> Path:
    """Patch a pristine tree, build the wheel into `staging`, verify it."""
    _step(f"patch: pristine vllm {ctx.tag} sdist + {len(ctx.series)} patches (quilt)")
    tree = patch_tree(tree_parent / "vllm", ctx, sdist)
    _step(f"build: vllm {ctx.version} (setup.py, precompiled kernels)")
    t0 = time.monotonic()
    wheel = build_wheel(
        tree,
        ctx.version,
        official,
        arch,
        staging,
        epoch,
        workdir / "logs" / "build.log",
        ctx.cuda,
    )
    _step(f"built {wheel.name} in {time.monotonic() - t0:.0f}s")
    _step(f"verify against {official.name}")
    problems = verify_wheel(wheel, official, tree, ctx)
    if problems:
        raise Fail(
            f"{wheel.name} differs from the official wheel beyond the series "
            "(nothing was written to dist/):\n  " + "\n  ".join(problems)
        )
    return wheel


def check_revision(ctx: BuildContext) -> None:
    """The version is the changelog's newest entry (a revision is bumped with
    its entry: tpfix.maint.revision)."""
    line = ctx.line
    newest = next(iter(changelog_entries(line)), ("none", ""))[0]
    if newest != ctx.version:
        raise Fail(
            f"{shown(line.version_file)}: {ctx.version}, but {shown(line.changelog)}'s newest "
            f"entry is {newest}; run: {bump_command(line)}"
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the command, not a usage block
        raise Fail(f"./build.sh: {message}; see ./build.sh --help")


def main() -> None:
    # the optional image stage
    from tpfix.image.image import add_image_args, check_image_args, image_from_args

    ap = _Parser(prog="./build.sh", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--arch",
        default=host_arch(),
        choices=[*wheel_arches(), "all"],
        help="the wheel's arch (default: this machine's); all: each arch the "
        "line pins, into one dist (with --image: an image each and a manifest list)",
    )
    ap.add_argument(
        "--line",
        choices=line_names(),
        default=None,
        help="release line: an upstream tag (default: the pinned one, VERSION)",
    )
    ap.add_argument("--dist", type=Path, help="default dist/ (dist/TAG/ for another line)")
    ap.add_argument("--workdir", type=Path, help="default build/work (build/work-TAG)")
    ap.add_argument(
        "--image", action="store_true", help="then build the container image (Dockerfile)"
    )
    ap.add_argument(
        "--no-cache",
        action="store_true",
        help="patch, build and verify even when the same wheel was built before",
    )
    add_sign_arg(ap)
    add_image_args(ap)
    args = ap.parse_args()
    check_tools()
    from tpfix.release.attest import signing_key

    signer = args.signer = signing_key(args.sign_key)
    line = args.line = get_line(args.line)
    ctx = BuildContext.resolve(line)  # the one read of VERSION, series and pins
    check_revision(ctx)
    arches = ctx.arches if args.arch == "all" else [args.arch]
    for arch in arches:
        ctx.wheel_pin(arch)  # the line pins it: else stop before any work
    if args.image:
        check_image_args(args, arches)  # before any download
    args.dist = args.dist or line.dist
    args.workdir = args.workdir or line.workdir
    sigterm_as_interrupt()
    # The image stage reads dist/: no other build may replace the wheel meanwhile.
    with build_locks(args.workdir, args.dist):
        dist = _prepare_folders(args.workdir, args.dist)
        releases = []
        for arch in arches:
            release = _run_locked(ctx, arch, dist, args.workdir, signer, not args.no_cache)
            print(release.wheel, flush=True)
            releases.append(release)
        if args.image:
            image_from_args(args, releases)


if __name__ == "__main__":
    main_wrapper(main)
