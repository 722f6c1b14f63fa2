# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The built-wheel cache: a rebuild with nothing changed publishes the wheel
that an earlier build made and verified, instead of patching and building
the same bytes again (the pipeline's build and verify steps; fetch and
package still run).

An entry is keyed by everything that determines the wheel's bytes: the
line's fingerprint (series, patches, pins), its version, the arch, the
SOURCE_DATE_EPOCH, the build requirements, the Python the build runs on and
the code that patches and builds (KEY_FILES).  It holds the wheel and its
sha256 as recorded when it was stored; a wheel that no longer has those
bytes is dropped with a warning and built again.  One entry per line and
arch: storing one removes the older ones.  `./build.sh --no-cache` builds
in full (and stores the result).

    <cache>/built/<tag>-<arch>/<key>/{<wheel>, sha256}
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

from tpfix.core import context, patch_format, quilt
from tpfix.core.context import BuildContext
from tpfix.core.lines import Line
from tpfix.core.util import ROOT, cache_dir, cache_lock, sha256_file
from tpfix.stages import build, patch

# What a build's bytes depend on besides the line: the build requirements
# (their lock: the exact versions) and the modules that fetch the inputs into
# a tree, patch it and build (the context: which series the tree gets).
KEY_FILES = [
    ROOT / "ci" / "requirements-build.lock",
    *(Path(m.__file__) for m in (build, context, patch, patch_format, quilt)),
]


def key(ctx: BuildContext, arch: str, epoch: int) -> str:
    h = hashlib.sha256()
    for part in (ctx.fingerprint, ctx.version, arch, str(epoch), sys.version.split()[0]):
        h.update(part.encode() + b"\0")
    for f in KEY_FILES:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _slot(line: Line, arch: str) -> Path:
    return cache_dir() / "built" / f"{line.tag}-{arch}"


def restore(line: Line, arch: str, entry_key: str, dest: Path, warn=print) -> Path | None:
    """The cached wheel of `entry_key` (key(), taken before the build), copied
    into folder `dest` and its bytes checked there; None when there is none,
    or when its bytes are not those recorded (the entry is then removed, with
    a warning)."""
    entry = _slot(line, arch) / entry_key
    try:
        (wheel,) = entry.glob("*.whl")
        want = (entry / "sha256").read_text().strip()
        copy = dest / wheel.name
        shutil.copyfile(wheel, copy)
    except (ValueError, FileNotFoundError):  # no entry, or removed meanwhile
        return None
    if sha256_file(copy) == want:
        return copy
    copy.unlink()
    warn(f"warning: {wheel}: not the bytes recorded when it was built; building again")
    with cache_lock(f"built-{line.tag}-{arch}"):
        shutil.rmtree(entry, ignore_errors=True)
    return None


def store(line: Line, arch: str, entry_key: str, wheel: Path) -> None:
    """Keep a verified `wheel` as the entry of `entry_key`, the key taken
    before it was built, so that a series or build code edited meanwhile
    does not file it under inputs it was not built from (replacing the line's
    and arch's older entries); written aside, then renamed in."""
    slot = _slot(line, arch)
    slot.mkdir(parents=True, exist_ok=True)
    entry = slot / entry_key
    with cache_lock(f"built-{line.tag}-{arch}"):
        tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=slot))
        try:
            (tmp / "sha256").write_text(sha256_file(wheel) + "\n")  # the verified bytes
            shutil.copyfile(wheel, tmp / wheel.name)
            shutil.rmtree(entry, ignore_errors=True)
            tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for old in slot.iterdir():
            if old != entry:
                shutil.rmtree(old, ignore_errors=True)
