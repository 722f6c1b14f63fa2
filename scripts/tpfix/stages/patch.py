# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 2: unpack the verified sdist into a fresh tree and apply the quilt series.

A patch must apply exactly (tpfix.core.quilt, Quilt.push_exact): quilt runs with
--fuzz=0 and any offset counts as a failure too.  Everything happens in a
temporary sibling folder that is renamed into place only when every patch
applied, so a tree is either pristine+series or absent, never half-patched.

    python -m tpfix.stages.patch DEST              # pristine + whole series
    python -m tpfix.stages.patch DEST --upto NAME  # ... up to and including NAME
    python -m tpfix.stages.patch DEST --upto ''    # pristine only
    python -m tpfix.stages.patch DEST --line v0.33.0   # another release line (patches/v0.33.0/)
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
from typing import TYPE_CHECKING

from tpfix.core.lines import Line, get_line, sdist_pin
from tpfix.core.patch_format import read_series, series_digest
from tpfix.core.quilt import Quilt
from tpfix.core.util import Fail, cache_dir, cache_lock, main_wrapper

if TYPE_CHECKING:
    from tpfix.core.context import BuildContext


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


def _upto(line: Line, upto: str | None) -> list[str]:
    """The names of `line`'s series up to and including `upto` (None: all, "": none)."""
    names = read_series(line.series)
    if upto is None:
        return names
    if upto == "":
        return []
    if upto not in names:
        raise Fail(f"{line.series}: no patch named {upto!r}")
    return names[: names.index(upto) + 1]


def pristine_tree(
    dest: Path,
    tag: str,
    line: Line | None = None,
    names=(),
    keep_quilt_state=False,
    sdist: Path | None = None,
):
    """Create `dest` = pristine sdist of `tag` (`sdist`, fetched already, or
    fetched here) + `names` of `line`'s series."""
    from tpfix.stages.fetch import fetch_sdist

    sdist = sdist or fetch_sdist(tag)
    dest = dest.resolve()
    if dest.exists():
        raise Fail(f"{dest} exists; remove it or choose another folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        top = unpack_sdist(sdist, tmp)
        if line is not None:
            Quilt(top, line.patches, line.series).push_exact(*names, tag=tag)
        if not keep_quilt_state:
            shutil.rmtree(top / ".pc", ignore_errors=True)
        os.replace(top, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def prepare_tree(
    dest: Path, line: Line, upto: str | None = None, keep_quilt_state: bool = False
) -> Path:
    """Create `dest` = pristine sdist of `line`'s tag + its series (up to and
    including `upto`).  `upto=None` applies the whole series, `upto=""` none of it."""
    names = _upto(line, upto)
    return pristine_tree(dest, line.tag, line, names, keep_quilt_state)


def patch_tree(dest: Path, ctx: BuildContext, sdist: Path) -> Path:
    """The build's patch stage: `dest` = `sdist` + the context's whole series."""
    return pristine_tree(dest, ctx.tag, ctx.line, ctx.series, sdist=sdist)


def series_key(names: list[str], line: Line) -> str:
    """A content key for pristine `line.tag`+`names`: changes when any of them
    changes (the sdist's sha256 and the series digest, patch_format.series_digest)."""
    key = f"{sdist_pin(line.tag).sha256}\0{series_digest(names, line.patches)}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def cached_tree(line: Line, upto: str | None = None) -> Path:
    """The pristine `line.tag` + its series up to `upto`, cached by content under <cache>/trees."""
    names = _upto(line, upto)
    dest = cache_dir() / "trees" / series_key(names, line)
    with cache_lock(f"tree-{dest.name}"):
        if not dest.exists():
            prepare_tree(dest, line, names[-1] if names else "")
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--upto", default=None, help="last patch to apply ('' = none)")
    ap.add_argument("--keep-quilt-state", action="store_true", help="keep .pc/")
    ap.add_argument("--line", help="release line: its tag and series (default: VERSION's)")
    args = ap.parse_args()
    line = get_line(args.line)
    print(prepare_tree(args.dest, line, args.upto, args.keep_quilt_state))


if __name__ == "__main__":
    main_wrapper(main)
