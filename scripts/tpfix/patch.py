# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 2: unpack the verified sdist into a fresh tree and apply the quilt series.

A patch must apply exactly (tpfix.quilt, Quilt.push_exact): quilt runs with
--fuzz=0 and any offset counts as a failure too.  Everything happens in a
temporary sibling folder that is renamed into place only when every patch
applied, so a tree is either pristine+series or absent, never half-patched.

    python -m tpfix.patch DEST              # pristine + whole series
    python -m tpfix.patch DEST --upto NAME  # ... up to and including NAME
    python -m tpfix.patch DEST --upto ''    # pristine only
    python -m tpfix.patch DEST --line v0.33.0   # another release line (lines/v0.33.0/)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

from tpfix.common import (
    PATCHES,
    SERIES,
    TAG,
    Fail,
    cache_dir,
    cache_lock,
    get_line,
    main_wrapper,
    sdist_pin,
)
from tpfix.patchfile import read_series, series_digest
from tpfix.quilt import Quilt


def unpack_sdist(sdist: Path, parent: Path) -> Path:
    """Extract `sdist` below `parent`; return the top folder of the tree.

    Modes are normalised (0755 folders and executables, 0644 otherwise) so the
    wheel does not depend on the sdist's 0664 modes or the caller's umask.
    """
    with tarfile.open(sdist) as tar:
        tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        if len(tops) != 1:
            raise Fail(f"{sdist.name}: expected one top-level folder, found {sorted(tops)}")
        tar.extractall(parent, filter="data")
    top = parent / tops.pop()
    for dirpath, _, filenames in os.walk(top):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                mode = os.stat(p).st_mode
                os.chmod(p, 0o755 if mode & stat.S_IXUSR else 0o644)
    return top


def prepare_tree(
    dest: Path,
    upto: str | None = None,
    series: Path = SERIES,
    patches: Path = PATCHES,
    keep_quilt_state: bool = False,
    tag: str = TAG,
) -> Path:
    """Create `dest` = pristine sdist of `tag` + series (up to and including `upto`).

    `upto=None` applies the whole series, `upto=""` none of it.
    """
    from tpfix.fetch import fetch_sdist

    names = read_series(series)
    if upto is not None:
        if upto == "":
            names = []
        elif upto not in names:
            raise Fail(f"{series}: no patch named {upto!r}")
        else:
            names = names[: names.index(upto) + 1]
    sdist = fetch_sdist(tag)
    dest = dest.resolve()
    if dest.exists():
        raise Fail(f"{dest} exists; remove it or choose another folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        top = unpack_sdist(sdist, tmp)
        Quilt(top, patches, series).push_exact(*names, tag=tag)
        if not keep_quilt_state:
            shutil.rmtree(top / ".pc", ignore_errors=True)
        os.replace(top, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def series_key(names: list[str], patches: Path = PATCHES, tag: str = TAG) -> str:
    """A content key for pristine `tag`+`names`: changes when any of them changes
    (the sdist's sha256 and the series digest, patchfile.series_digest)."""
    key = f"{sdist_pin(tag).sha256}\0{series_digest(names, patches)}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def cached_tree(
    upto: str | None = None,
    tag: str = TAG,
    series: Path = SERIES,
    patches: Path = PATCHES,
) -> Path:
    """The pristine `tag`+`series` up to `upto`, cached by content under <cache>/trees."""
    names = read_series(series)
    if upto == "":
        names = []
    elif upto is not None:
        names = names[: names.index(upto) + 1]
    dest = cache_dir() / "trees" / series_key(names, patches, tag)
    with cache_lock(f"tree-{dest.name}"):
        if not dest.exists():
            prepare_tree(dest, names[-1] if names else "", series, patches, tag=tag)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--upto", default=None, help="last patch to apply ('' = none)")
    ap.add_argument("--keep-quilt-state", action="store_true", help="keep .pc/")
    ap.add_argument("--line", help="release line: its tag and series (default: VERSION's)")
    args = ap.parse_args()
    line = get_line(args.line)
    print(
        prepare_tree(
            args.dest, args.upto, line.series, line.patches, args.keep_quilt_state, tag=line.tag
        )
    )


if __name__ == "__main__":
    main_wrapper(main)
