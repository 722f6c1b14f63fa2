# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Patch files and series files of a quilt series: the one parser and writer.

A patch file (patches/TAG/NNNN-*.patch) is a header
followed by a -p1 unified diff (a/ and b/ prefixes, as quilt refreshes it
with quilt.REFRESH_ARGS).  The header is everything above the first file
diff; quilt keeps it on refresh.  It is in git format-patch style, with the
DEP-3 fields (https://dep-team.pages.debian.net/deps/dep3/) in its trailer
block:

    From: Name <email>
    Date: Tue, 01 Dec 2026 10:00:00 +0000
    Subject: [PATCH] [Bugfix] What it does, folded
     onto a second line

    Why, at length: the body.

    Bug: https://github.com/vllm-project/vllm/issues/NNN
    Related: vllm#NNN (what it is)
    Forwarded: no
    Scenario: bug_a:warm_start
     what the scenario shows when the patch works
    Claim: one claim of the fix, for the pull request
    Signed-off-by: Name <email>
    ---

Mail fields (From, Date, Subject) open the header; the trailer block is its
last paragraph of `Key: value` fields.  A line starting with a space
continues the field above (values are joined with one space).  Fields read
here: `Bug:` (the upstream bug, DEP-3), `Forwarded:` (`no`, `not-needed` or
the pull request's URL), `Applied-Upstream:` (the upstream version or commit
that has the fix, for a patch found absorbed), `Related:` (related upstream
issues and pull requests: an extra field), `Scenario:` (the replay that shows
the fix: tpfix.replay.harness.scenario_check), `Claim:` (one claim of the
fix, for the pull request: maint.export), `Signed-off-by:`.  maint.export
turns a header into the commit message of the upstream mail.

The series file lists the patches in order, one a line (`#` starts a
comment); `series_digest` is the one content hash of a series.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from tpfix.core.util import Fail

# Where the diff starts: the first file diff's first line.
DIFF_START = re.compile(r"^(?:--- \S|diff |Index: )", re.M)
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.*)$")


# -- header / diff ----------------------------------------------------------------


def split(text: str) -> tuple[str, str]:
    """(header, diff): the header is everything above the first file diff."""
    m = DIFF_START.search(text)
    return (text, "") if m is None else (text[: m.start()], text[m.start() :])


@dataclass
class FileDiff:
    """One file of a diff: its paths in the tree (without a/ b/) and hunks."""

    old: str | None  # None for a file the patch adds
    new: str | None  # None for a file the patch deletes
    hunks: list[str] = field(default_factory=list)  # the "@@ ... @@" lines

    @property
    def path(self) -> str:
        return self.new or self.old or "?"

    @property
    def added(self) -> bool:
        return self.old is None

    @property
    def deleted(self) -> bool:
        return self.new is None


def _tree_path(p: str) -> str | None:
    p = p.split("\t", 1)[0].strip()
    if p == "/dev/null":
        return None
    return p.split("/", 1)[1] if "/" in p else p


def parse_diff(diff: str) -> list[FileDiff]:
    """The files and hunk headers of a -p1 unified diff.

    Hunk bodies are skipped by their line counts, so a changed line that
    reads like a file header ("--- x" removed, "+++ y" added) is not one.
    """
    files: list[FileDiff] = []
    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FileDiff(_tree_path(line[4:]), _tree_path(lines[i + 1][4:])))
            i += 2
            continue
        i += 1
        m = HUNK.match(line)
        if not (m and files):
            continue
        files[-1].hunks.append(line)
        old = int(m.group(2)) if m.group(2) is not None else 1
        new = int(m.group(4)) if m.group(4) is not None else 1
        while (old > 0 or new > 0) and i < len(lines):
            body = lines[i]
            i += 1
            if body.startswith("\\"):  # "\ No newline at end of file"
                continue
            if body.startswith("-"):
                old -= 1
            elif body.startswith("+"):
                new -= 1
            else:  # context (" ", or an empty line where the space was lost)
                old -= 1
                new -= 1
    return files


# -- the header's fields ------------------------------------------------------------


def _fold_into(fields: list[tuple[str, str]], line: str) -> None:
    """Append continuation `line` to the last field (one space between)."""
    key, value = fields[-1]
    fields[-1] = (key, value + " " + line.strip())


@dataclass
class Header:
    """A patch header: mail fields, body and the trailer block (see module doc).

    Field values have their continuation lines joined with one space.
    """

    fields: list[tuple[str, str]] = field(default_factory=list)  # From, Date, Subject
    body: str = ""
    trailers: list[tuple[str, str]] = field(default_factory=list)

    def mail_field(self, key: str) -> str | None:
        """The mail field `key` (From, Date, Subject) at the top of the header."""
        values = [v for k, v in self.fields if k.lower() == key.lower()]
        return values[-1] if values else None

    def get_all(self, key: str) -> list[str]:
        """The values of trailer `key` (case-insensitive), in order."""
        return [v for k, v in self.trailers if k.lower() == key.lower()]

    def get(self, key: str) -> str | None:
        values = self.get_all(key)
        return values[0] if values else None


def parse_header(header: str, name: str = "?") -> Header:
    """The mail fields at the top, the body, and the trailer block at the end.

    The trailer block is the last paragraph when it starts with a `Key:
    value` field; each of its lines is a field or a continuation of the one
    above (starting with a space), anything else is an error naming `name`.
    A final `---` line (the separator above the diff) is not part of it.
    """
    lines = header.rstrip("\n").splitlines()
    while lines and lines[-1].strip() in ("---", ""):
        lines.pop()
    fields: list[tuple[str, str]] = []
    i = 0
    while i < len(lines) and (m := FIELD.match(lines[i])):
        fields.append((m.group(1), m.group(2)))
        i += 1
        while i < len(lines) and lines[i].startswith(" "):
            _fold_into(fields, lines[i])
            i += 1
    rest = lines[i:]
    cut = len(rest)
    while cut > 0 and rest[cut - 1].strip():
        cut -= 1
    block = rest[cut:]
    trailers: list[tuple[str, str]] = []
    if block and FIELD.match(block[0]):
        for line in block:
            if line.startswith(" "):
                _fold_into(trailers, line)
            elif m := FIELD.match(line):
                trailers.append((m.group(1), m.group(2)))
            else:
                raise Fail(
                    f"{name}: header line {line!r} in the trailer block (the last "
                    "paragraph) is neither a `Key: value` field nor a continuation; "
                    "indent a continuation with a space, or end the body with a blank line"
                )
        rest = rest[:cut]
    return Header(fields, "\n".join(rest).strip("\n"), trailers)


@dataclass
class Patch:
    """A patch file: its name, header (text and fields) and diff (text and files)."""

    name: str
    header_text: str
    diff: str
    header: Header
    files: list[FileDiff]

    @classmethod
    def parse(cls, text: str, name: str = "?") -> Patch:
        header, diff = split(text)
        return cls(name, header, diff, parse_header(header, name), parse_diff(diff))


def read_patch(path: Path) -> Patch:
    """The patch file at `path`, parsed (named by its file name in errors)."""
    return Patch.parse(path.read_text(), path.name)


def diff_files(path: Path) -> list[FileDiff]:
    """The files of patch file `path`'s diff (its header is not parsed)."""
    return parse_diff(split(path.read_text())[1])


# -- series files ---------------------------------------------------------------------


def read_series(series: Path) -> list[str]:
    """The patch names of `series` in order ([] when the file does not exist)."""
    return parse_series(series.read_text()) if series.exists() else []


def parse_series(text: str) -> list[str]:
    """The patch names of a series file's `text`, in order."""
    names = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line.split()[0])
    return names


def write_series(series: Path, names: list[str]) -> None:
    """Write `names` as the series file `series`, one a line."""
    series.write_text("".join(f"{n}\n" for n in names))


def series_digest(names: list[str], patches: Path) -> str:
    """sha256 (hex) of the series `names` of folder `patches`: each patch's
    name and bytes, in order.  It changes when any patch, its name or the
    order changes; comments in the series file do not count.  Callers add
    their own inputs (the tree cache adds the sdist, patch.series_key)."""
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0" + (patches / name).read_bytes() + b"\0")
    return h.hexdigest()
