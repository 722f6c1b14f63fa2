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

from tpfix.core.lines import (
    ENTRY,
    LABEL,
    Line,
    bump_command,
    fingerprint,
    get_line,
    line_names,
    read_version,
    revision_number,
    revision_problems,
)
from tpfix.core.util import Fail, main_wrapper, shown, write_atomic


def bump(line: Line, what: str) -> str:
    """Increment the line's revision; write VERSION and the new CHANGELOG.md
    entry (with the fingerprint of the line as it is now).  Returns the version."""
    what = what.strip()
    if not what:
        raise Fail(f"say what changed for users: {bump_command(line)}")
    current = read_version(line.version_file)
    new = f"{line.tag[1:]}+{LABEL}.{revision_number(line, current) + 1}"
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
    wrong = [
        p
        for t in ([args.tag] if args.tag else line_names())
        for p in revision_problems(get_line(t))
    ]
    if wrong:
        raise Fail("\n  ".join(wrong))
    print("every line's revision matches what it ships")


if __name__ == "__main__":
    main_wrapper(main)
