# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A line's revision: the number after +tpfix., which only grows.

    python -m tpfix.maint.revision bump v0.27.1 "what changed, for users"
    python -m tpfix.maint.revision check [TAG]    # every line by default

VERSION is <upstream>+tpfix.<revision>.  The revision is bumped whenever what
the line ships changes (its series, a patch file's bytes, its pins.toml); it is
not the number of patches, so dropping a patch still moves the version up.

patches/<tag>/CHANGELOG.md has one entry per revision, newest first:

    ## 0.27.1+tpfix.6

    fingerprint: sha256:<fingerprint() of the line as this revision ships it>

    What changed, for users.

`bump` increments VERSION and writes that entry; `check` (and the fast test
tests/test_revision.py) fails when the line's fingerprint is not the newest
entry's, when VERSION is not the newest entry, or when the revisions do not
strictly increase.
"""

from __future__ import annotations

import argparse
import hashlib
import re

from packaging.version import Version

from tpfix.lines import LABEL, Line, get_line, line_names, read_version
from tpfix.patch_format import read_series
from tpfix.util import Fail, main_wrapper, shown, write_atomic

ENTRY = re.compile(r"^## (\S+)[ \t]*$", re.M)
FINGERPRINT = re.compile(r"^fingerprint: sha256:([0-9a-f]{64})[ \t]*$", re.M)


def fingerprint(line: Line) -> str:
    """sha256 (hex) over what the line ships: its series file, each patch the
    series names (name and bytes, in order) and its pins.toml."""
    h = hashlib.sha256()
    h.update(b"series\0" + line.series.read_bytes() + b"\0")
    for name in read_series(line.series):
        h.update(name.encode() + b"\0" + (line.patches / name).read_bytes() + b"\0")
    h.update(b"pins.toml\0" + line.pins.read_bytes() + b"\0")
    return h.hexdigest()


def entries(line: Line) -> list[tuple[str, str]]:
    """(version, text below its heading) of each CHANGELOG.md entry, as listed."""
    text = line.changelog.read_text() if line.changelog.exists() else ""
    heads = list(ENTRY.finditer(text))
    ends = [m.start() for m in heads[1:]] + [len(text)]
    return [(m.group(1), text[m.end() : end]) for m, end in zip(heads, ends)]


def bump_command(line: Line) -> str:
    return f'python -m tpfix.maint.revision bump {line.tag} "what changed, for users"'


def problems(line: Line) -> list[str]:
    """What is wrong with the line's revision and changelog ([] when nothing)."""
    log, hint = shown(line.changelog), f"run: {bump_command(line)}"
    found = entries(line)
    if not found:
        return [f"{log}: no `## <version>` entry; {hint}"]
    out = []
    listed = [v for v, _ in found]
    for newer, older in zip(listed, listed[1:]):
        if _revision(line, newer) <= _revision(line, older):
            out.append(f"{log}: {newer} is listed above {older}: revisions must strictly increase")
    version = read_version(line.version_file)
    if listed[0] != version:
        out.append(
            f"{shown(line.version_file)}: {version}, but {log}'s newest entry is {listed[0]}; "
            f"write the entry or {hint}"
        )
    m = FINGERPRINT.search(found[0][1])
    now = fingerprint(line)
    if not m:
        out.append(f"{log}: the newest entry {listed[0]} records no `fingerprint: sha256:<hex>`")
    elif m.group(1) != now:
        out.append(
            f"{shown(line.patches)}: the series, a patch or pins.toml changed since "
            f"{listed[0]} (fingerprint {now[:12]}, the changelog says {m.group(1)[:12]}); {hint}"
        )
    return out


def _revision(line: Line, version: str) -> int:
    """The revision number of `version` (<upstream>+tpfix.<n>), checked."""
    m = re.fullmatch(rf"{re.escape(line.tag[1:])}\+{LABEL}\.(\d+)", version)
    if not m or str(Version(version)) != version:
        raise Fail(f"{shown(line.changelog)}: entry {version!r} is not {line.tag[1:]}+{LABEL}.<n>")
    return int(m.group(1))


def bump(line: Line, what: str) -> str:
    """Increment the line's revision; write VERSION and the new CHANGELOG.md
    entry (with the fingerprint of the line as it is now).  Returns the version."""
    what = what.strip()
    if not what:
        raise Fail(f"say what changed for users: {bump_command(line)}")
    current = read_version(line.version_file)
    new = f"{line.tag[1:]}+{LABEL}.{_revision(line, current) + 1}"
    text = line.changelog.read_text() if line.changelog.exists() else f"# {line.tag}\n"
    entry = f"## {new}\n\nfingerprint: sha256:{fingerprint(line)}\n\n{what}\n"
    first = ENTRY.search(text)
    if first:  # newest first: above the entry that was the newest
        text = text[: first.start()] + entry + "\n" + text[first.start() :]
    else:
        text = text.rstrip("\n") + "\n\n" + entry
    write_atomic(line.changelog, text)
    write_atomic(line.version_file, new + "\n")
    return new


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bump", help="increment the line's revision, with a changelog entry")
    b.add_argument("tag", choices=line_names())
    b.add_argument("what", help="what the new revision changes, for users")
    c = sub.add_parser("check", help="every line's revision matches what it ships")
    c.add_argument("tag", nargs="?", choices=line_names())
    args = ap.parse_args()
    if args.command == "bump":
        line = get_line(args.tag)
        print(f"{shown(line.version_file)}: {bump(line, args.what)}")
        return
    wrong = [p for t in ([args.tag] if args.tag else line_names()) for p in problems(get_line(t))]
    if wrong:
        raise Fail("\n  ".join(wrong))
    print("every line's revision matches what it ships")


if __name__ == "__main__":
    main_wrapper(main)
