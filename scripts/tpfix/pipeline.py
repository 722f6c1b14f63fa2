# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The whole job behind ./build.sh: fetch -> verify -> patch -> build -> verify -> package.

    ./build.sh                      # wheel for this machine's arch into dist/
    ./build.sh --arch aarch64       # the other official arch (nothing compiles)
    ./build.sh --dist DIR           # somewhere else than dist/
    ./build.sh --line v0.33.0       # another release line (patches/v0.33.0/) into dist/v0.33.0/
    ./build.sh --image [...]        # then the container image (scripts/tpfix/image.py)

Work happens under build/ (a fresh patched tree per run, logs) and a staging
folder next to dist/; dist/ only ever receives a verified wheel.

One build per folder: a run holds an exclusive lock on its work folder
(`<workdir>/.lock`) and on its dist folder (build/dists/<name>-<hash>/lock,
common.dist_state: dist/ holds published files only) from start to end, image
stage included.  A second build
on either stops at once, naming the first (pid, start time, command line);
it does not wait (why: tpfix/worklock.py).  What a killed run left behind
(`<workdir>/tree.*`, `.<dist>-staging.*`) is removed only while holding both.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tpfix.build import build_wheel, source_date_epoch
from tpfix.common import (
    Fail,
    Line,
    Release,
    add_sign_arg,
    get_line,
    host_arch,
    line_names,
    main_wrapper,
    read_version,
    shown,
    sigterm_as_interrupt,
)
from tpfix.fetch import fetch_sdist, fetch_wheel
from tpfix.maint.revision import bump_command, entries
from tpfix.package import describe, publish
from tpfix.patch import prepare_tree
from tpfix.patch_format import read_series
from tpfix.verify import verify_wheel
from tpfix.worklock import dist_lock, workdir_lock


def _step(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


def _staging_prefix(dist: Path) -> str:
    # Named after its dist folder, so that a build into a sibling folder
    # (--dist elsewhere in the same parent) never removes this one's.
    return f".{dist.name}-staging."


@contextlib.contextmanager
def build_locks(workdir: Path, dist: Path):
    """Hold the work folder and the dist folder for one build (see worklock)."""
    with workdir_lock(workdir), dist_lock(dist):
        yield


# The Python packages the package stage needs (ci/requirements-build.txt).
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
            "ci/requirements-build.txt (or: pip install -r ci/requirements-build.txt)"
        )


def _run_locked(arch: str, dist: Path, workdir: Path, line: Line, signer=None) -> Release:
    """The whole build of `line`; the caller holds build_locks(workdir, dist).
    Returns the published wheel with the facts of its build (for the image stage)."""
    version = read_version(line.version_file)
    tag = line.tag
    names = read_series(line.series)
    newest = next(iter(entries(line)), ("none", ""))[0]
    if newest != version:
        # the revision is bumped with its changelog entry (tpfix.maint.revision)
        raise Fail(
            f"{shown(line.version_file)}: {version}, but {shown(line.changelog)}'s newest "
            f"entry is {newest}; run: {bump_command(line)}"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    dist = dist.resolve()
    dist.parent.mkdir(parents=True, exist_ok=True)
    prefix = _staging_prefix(dist)
    # Left by a killed run: no live build can own them, as we hold both locks.
    for stale in list(workdir.glob("tree.*")) + list(dist.parent.glob(prefix + "*")):
        shutil.rmtree(stale, ignore_errors=True)
    _step(f"fetch + verify pins of {tag} (vllm sdist, official {arch} wheel)")
    sdist = fetch_sdist(tag)
    official = fetch_wheel(arch, tag)
    tree_parent = Path(tempfile.mkdtemp(prefix="tree.", dir=workdir))
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=dist.parent))
    try:
        _step(f"patch: pristine {sdist.name} + {len(names)} patches (quilt)")
        tree = prepare_tree(tree_parent / "vllm", line)
        _step(f"build: vllm {version} (setup.py, precompiled kernels)")
        t0 = time.monotonic()
        epoch = source_date_epoch(sdist)
        wheel = build_wheel(
            tree,
            version,
            official,
            arch,
            staging,
            epoch,
            workdir / "logs" / "build.log",
            line.official_cuda(),
        )
        _step(f"built {wheel.name} in {time.monotonic() - t0:.0f}s")
        _step(f"verify against {official.name}")
        problems = verify_wheel(wheel, official, tree, version, line, names)
        if problems:
            raise Fail(
                f"{wheel.name} differs from the official wheel beyond the series "
                "(nothing was written to dist/):\n  " + "\n  ".join(problems)
            )
        _step("package: SBOM, provenance" + (" (signed)" if signer else "") + ", index")
        extras = describe(wheel, line, sdist, official, arch, epoch, signer)
        _step(f"package into {dist}")
        final = publish(wheel, dist, extras)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(tree_parent, ignore_errors=True)
    return Release(line, version, final, sdist, official, arch, epoch)


def main() -> None:
    from tpfix.image import add_image_args, image_from_args  # the optional image stage

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=host_arch(), choices=["x86_64", "aarch64"])
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
    add_sign_arg(ap)
    add_image_args(ap)
    args = ap.parse_args()
    check_tools()
    from tpfix.attest import signing_key

    signer = args.signer = signing_key(args.sign_key)
    line = args.line = get_line(args.line)
    args.dist = args.dist or line.dist
    args.workdir = args.workdir or line.workdir
    sigterm_as_interrupt()
    # The image stage reads dist/: no other build may replace the wheel meanwhile.
    with build_locks(args.workdir, args.dist):
        release = _run_locked(args.arch, args.dist, args.workdir, line, signer)
        print(release.wheel, flush=True)
        if args.image:
            image_from_args(args, release)


if __name__ == "__main__":
    main_wrapper(main)
