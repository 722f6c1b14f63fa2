# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What the package stage's publish (tpfix.stages.package) may do in a dist
folder it shares with other builds, other arches and the operator's files:
move files in whole (across file systems too), know a killed publish's
files as its own (dist/.publishing), sign the statements it keeps with the
folder's one key, keep or drop an arch's audit reports, and name what it
did not write."""

from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tpfix.core.lines import get_line, line_names
from tpfix.core.util import PARTIAL
from tpfix.core.wheelfile import wheel_arch

PUBLISHING = ".publishing"  # dist/.publishing: what a publish moves in, until it ends
SUMS_ENVELOPE = "SHA256SUMS.intoto.jsonl"  # attest.SUMS_ENVELOPE


def keyids(signer) -> set[str]:
    return {signer.public_key.keyid} if signer is not None else set()


def signed_by(envelope: Path) -> set[str]:
    """The keyids of a DSSE envelope's signatures (none: no envelope)."""
    import json

    try:
        doc = json.loads(envelope.read_text())
    except (OSError, ValueError):
        return set()
    return {sig.get("keyid", "") for sig in doc.get("signatures", [])}


def move_in(src: Path, dest: Path) -> None:
    """`src` to `dest`, atomically: a rename on one file system; where dist/ is
    on another (a mount point), a copy beside `dest` (util.PARTIAL), renamed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dest)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}{PARTIAL}", dir=dest.parent)
        os.close(fd)
        try:
            shutil.copy2(src, tmp)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        src.unlink()


def pending_moves(dist: Path) -> set[Path]:
    """What a publish killed before its end was moving in (dist/.publishing):
    this project's files, though no SHA256SUMS lists them yet."""
    try:
        return {Path(n) for n in (dist / PUBLISHING).read_text().splitlines() if n}
    except OSError:
        return set()


def resign(dist: Path, staging: Path, kept: list[Path], signer) -> list[Path]:
    """Envelopes of the kept statements (the other arch's wheel and images)
    signed by `signer`, written into `staging`, where theirs are another
    key's or missing: one folder, one signer."""
    from tpfix.release import attest

    out = []
    for rel in kept:
        env = rel.with_name(attest.signed_name(rel.name))
        if signer is None or not rel.name.endswith(".provenance.json"):
            continue
        if signed_by(dist / env) != keyids(signer):
            (staging / env).parent.mkdir(parents=True, exist_ok=True)
            (staging / env).write_text(attest.sign((dist / rel).read_bytes(), signer))
            out.append(env)
    return out


# What the audits add beside a wheel, and the command that remakes each.
AUDITS = {
    ".resolved.cdx.json": "tpfix.audit.resolved_sbom",
    ".advisories.json": "tpfix.audit.advisories",
    ".vex.cdx.json": "tpfix.audit.advisories",
}


def kept_audits(dist, wheel, listed_sha, remade, still_true) -> list[Path]:
    """The audit reports of `wheel`'s arch listed in dist/ (AUDITS): kept where
    `still_true` (the wheel and its SBOM byte for byte the listed ones: a
    cached rebuild), else dropped, saying so in one line with how to remake them."""
    mine = [Path(wheel.name + s) for s in AUDITS if wheel.name + s in listed_sha]
    mine = [p for p in mine if p not in remade]
    if mine and not still_true:
        tag = "v" + wheel.name.split("-")[1].split("+")[0]
        line = f" --line {tag}" if tag in line_names() and tag != get_line().tag else ""
        how = "; ".join(
            sorted({f"build/venv/bin/python -m {AUDITS[p.name[len(wheel.name) :]]}" for p in mine})
        )
        names = ", ".join(sorted(p.name for p in mine))
        print(
            f"note: dropped {names} from {dist}: the wheel or its SBOM changed; "
            f"remake: {how} --dist {dist}{line} --arch {wheel_arch(wheel)}",
            file=sys.stderr,
        )
    return mine if still_true else []


def warn_foreign(dist: Path, now: list[Path]) -> None:
    """One line naming what dist/ holds that no build of this project wrote:
    kept, as the build removes only what a SHA256SUMS of it listed."""
    from tpfix.release.dist_verify import unlisted

    extra = unlisted(str(dist), [p.as_posix() for p in now])[0]
    if extra:
        shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
        print(
            f"warning: kept in {dist} what no build of this project wrote: {shown} "
            "(a server publishing the folder serves them and verify.py --dist refuses it: "
            "move them out)",
            file=sys.stderr,
        )
