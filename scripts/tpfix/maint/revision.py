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

A revision, once committed, names one content forever: `check` also walks the
git history (every commit reachable from HEAD counts as landed) and fails when
a VERSION names another fingerprint than it did in an earlier commit
(history_problems; `history` lists them, tests/test_history.py).  What did so
before this check existed is recorded in patches/HISTORY-EXCEPTIONS.toml and
tolerated exactly there.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tpfix.audit.support_matrix import README, update_readme
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
    tag_version,
)
from tpfix.core.patch_format import parse_series
from tpfix.core.util import ROOT, Fail, main_wrapper, run, shown, write_atomic


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


# ---- A revision, once committed, names one content forever -------------------
#
# Every commit reachable from HEAD counts as landed (this repository has no
# other landing marker): a line's VERSION must name the same fingerprint in
# every commit that holds it.  The revisions that named more than one before
# this check existed are the past; EXCEPTIONS records them, each with the
# fingerprints it named, tolerated only in the commits up to `through`.

EXCEPTIONS = "patches/HISTORY-EXCEPTIONS.toml"  # read from the commit checked


@dataclass(frozen=True)
class Commit:
    sha: str
    short: str
    subject: str

    def __str__(self) -> str:
        said = self.subject if len(self.subject) <= 60 else self.subject[:57] + "..."
        return f'{self.short} "{said}"'


@dataclass
class Content:
    """One content (fingerprint) a revision names, in these commits (oldest first)."""

    fingerprint: str
    commits: list[Commit]
    new: list[Commit] = field(default_factory=list)  # those no exception tolerates

    @property
    def tolerated(self) -> bool:
        return not self.new


@dataclass
class Violation:
    """Line `tag`'s revision `version` names more than one content."""

    tag: str
    version: str
    contents: list[Content]

    @property
    def new(self) -> list[Commit]:
        """The commits naming a content no exception tolerates there."""
        return [x for c in self.contents for x in c.new]


@dataclass
class Walk:
    """What each commit's line folders name: revision -> its contents in order."""

    commits: list[Commit]
    names: dict[tuple[str, str], dict[str, list[Commit]]]  # (tag, version) -> fp -> commits
    shallow: list[str]  # the shallow boundary's commits; [] for a whole history
    exceptions: str | None  # EXCEPTIONS' text at the tip, None without one


class _Objects:
    """One `git cat-file --batch` for the whole walk."""

    def __init__(self, repo: Path):
        self.proc = subprocess.Popen(
            ["git", "-C", str(repo), "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def get(self, name: str) -> tuple[str, str, bytes] | None:
        """(sha, type, bytes) of object `name` (<sha> or <tree-ish>:<path>), or None."""
        self.proc.stdin.write(name.encode() + b"\n")
        self.proc.stdin.flush()
        head = self.proc.stdout.readline().split()
        if len(head) != 3:  # "<name> missing"
            return None
        return head[0].decode(), head[1].decode(), self.proc.stdout.read(int(head[2]) + 1)[:-1]

    def folders(self, tree: bytes, size: int) -> dict[str, str]:
        """The sub-folders of a tree object's bytes: name -> tree sha."""
        out, i = {}, 0
        while i < len(tree):
            space, nul = tree.index(b" ", i), tree.index(b"\0", i)
            if tree[i:space] == b"40000":
                out[tree[space + 1 : nul].decode()] = tree[nul + 1 : nul + 1 + size].hex()
            i = nul + 1 + size
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# Line folder tree sha -> (VERSION, fingerprint), or None for a folder that is
# no line: every walk of this process reuses it (a tree's content never changes).
_CONTENT: dict[str, tuple[str, str] | None] = {}


def _content(objects: _Objects, tree: str, tag: str) -> tuple[str, str] | None:
    """(VERSION, lines.fingerprint()) of line folder `tree` (its blobs written to a
    temporary folder); None for a folder that is no line (no VERSION, no tag)."""
    blob = objects.get(f"{tree}:VERSION")
    if not tag_version(tag) or not blob or blob[1] != "blob":
        return None
    version = blob[2].decode(errors="replace").strip()
    with tempfile.TemporaryDirectory() as tmp:
        line = Line.at(Path(tmp) / tag)
        line.patches.mkdir()
        try:
            for path in (line.series, line.pins):
                got = objects.get(f"{tree}:{path.name}")
                path.write_bytes(got[2] if got and got[1] == "blob" else b"")
            for name in parse_series(line.series.read_text()):
                got = objects.get(f"{tree}:{name}")
                if got and got[1] == "blob":  # a missing patch fails fingerprint()
                    (line.patches / name).parent.mkdir(parents=True, exist_ok=True)
                    (line.patches / name).write_bytes(got[2])
            return version, fingerprint(line)
        except (OSError, ValueError, Fail) as e:  # a broken folder is a content too
            return version, f"unreadable: {type(e).__name__}: {e}"


def _git(repo: Path, *args: str) -> str:
    proc = run(["git", "-C", str(repo), *args])
    if proc.returncode:
        raise Fail(f"git {' '.join(args)} (in {repo}): {proc.stderr.strip()}")
    return proc.stdout


def walk(repo: Path = ROOT, rev: str = "HEAD") -> Walk:
    """Every commit reachable from `rev`, parents before children, and what the line
    folders patches/<tag>/ of each name: which VERSION names which fingerprint."""
    log = _git(repo, "log", "--topo-order", "--reverse", "--format=%H%x00%h%x00%s", rev, "--")
    commits = [Commit(*line.split("\0", 2)) for line in log.splitlines()]
    shallow = []
    if _git(repo, "rev-parse", "--is-shallow-repository").strip() == "true":
        marks = Path(repo, _git(repo, "rev-parse", "--git-path", "shallow").strip())
        shallow = marks.read_text().split() if marks.exists() else ["?"]
    names: dict[tuple[str, str], dict[str, list[Commit]]] = {}
    per_tree: dict[str, list[tuple[str, tuple[str, str]]]] = {}  # patches/ sha -> lines
    objects = _Objects(repo)
    try:
        for c in commits:
            got = objects.get(f"{c.sha}:patches")
            if not got or got[1] != "tree":
                continue
            if got[0] not in per_tree:
                lines = []
                for tag, sha in objects.folders(got[2], len(got[0]) // 2).items():
                    if sha not in _CONTENT:
                        _CONTENT[sha] = _content(objects, sha, tag)
                    if _CONTENT[sha]:
                        lines.append((tag, _CONTENT[sha]))
                per_tree[got[0]] = lines
            for tag, (version, fp) in per_tree[got[0]]:
                names.setdefault((tag, version), {}).setdefault(fp, []).append(c)
        tip = objects.get(f"{rev}:{EXCEPTIONS}")
    finally:
        objects.close()
    text = tip[2].decode() if tip and tip[1] == "blob" else None
    return Walk(commits, names, shallow, text)


def _exceptions(repo: Path, text: str | None) -> tuple[str, set[str], dict[str, set[str]], str]:
    """EXCEPTIONS' text read: its `through` commit (full sha), the commits it
    covers (that commit and its ancestors), per revision the fingerprints
    tolerated there, and what keeps it from being read ("" when nothing)."""
    if text is None:
        return "", set(), {}, ""
    try:
        data = tomllib.loads(text)
        known = {e["version"]: set(e["fingerprints"]) for e in data.get("revision", [])}
        through = data["through"]
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        return "", set(), {}, f"{EXCEPTIONS}: not readable ({type(e).__name__}: {e})"
    proc = run(["git", "-C", str(repo), "rev-list", f"{through}^{{commit}}", "--"])
    if proc.returncode:
        return (
            "",
            set(),
            known,
            f"{EXCEPTIONS}: its `through` commit {through} is not in this history",
        )
    covered = proc.stdout.split()
    return covered[0], set(covered), known, ""


def history_violations(repo: Path = ROOT, rev: str = "HEAD") -> tuple[list[Violation], list[str]]:
    """Every revision that names more than one content over the history of `rev`,
    each content marked tolerated or not, and the problems: each revision with a
    content not tolerated, what EXCEPTIONS lists that history does not show, and
    a shallow clone (its history before the boundary cannot be checked).

    In the commits EXCEPTIONS covers, a revision may name the fingerprints it lists
    for it; in every other commit, only the one it names at `through` (the one it
    first names, for a revision new since then; none, for a revision that had left
    the history with several).  Without EXCEPTIONS, one content per revision."""
    w = walk(repo, rev)
    through, covered, known, unread = _exceptions(repo, w.exceptions)
    problems = [unread] if unread else []
    if w.shallow:
        problems.insert(
            0,
            f"{repo} is a shallow clone: its history older than "
            f"{', '.join(s[:12] for s in w.shallow)} cannot be checked (git fetch --unshallow)",
        )
    out = []
    for (tag, version), by_fp in w.names.items():
        contents = [Content(fp, cs) for fp, cs in by_fp.items()]  # in order of first naming
        old = {c.fingerprint for c in contents if any(x.sha in covered for x in c.commits)}
        if through and version in known and (known[version] != old or len(old) < 2):
            problems.append(
                f"{EXCEPTIONS}: {version} lists {sorted(fp[:12] for fp in known[version])}, but "
                f"up to {through[:12]} it named {sorted(fp[:12] for fp in old)}: "
                "an exception records exactly the contents a revision named, two or more"
            )
        if len(contents) < 2:
            continue
        before = old if len(old) < 2 else known.get(version, set())
        at = {c.fingerprint for c in contents if through in {x.sha for x in c.commits}}
        if at or len(old) == 1:  # what it named last before the check (or its only content)
            after = at or old
        elif old:  # it left the history with several: it names nothing again
            after = set()
        else:  # new since `through`: the content it was first committed with
            after = {contents[0].fingerprint}
        for c in contents:
            c.new = [
                x for x in c.commits if c.fingerprint not in (before if x.sha in covered else after)
            ]
        v = Violation(tag, version, contents)
        out.append(v)
        if v.new:
            problems.append(_said(v))
    for version in sorted(set(known) - {v for _, v in w.names} if through else ()):
        problems.append(f"{EXCEPTIONS}: {version} is named by no commit of this history")
    return out, problems


def _said(v: Violation) -> str:
    """A violation in words: the revision, each content with the commits naming it
    (marked `!` where no exception tolerates it, with those commits when not all)."""
    rows = []
    for c in v.contents:
        last = f" .. {c.commits[-1]}" if len(c.commits) > 1 else ""
        mark = "!" if c.new else " "
        rows.append(f"{mark} {c.fingerprint[:12]} {len(c.commits)} commit(s): {c.commits[0]}{last}")
        if c.new and c.new != c.commits:
            rows += [f"    not tolerated in {x}" for x in c.new]
    return (
        f"patches/{v.tag}: {v.version} names {len(v.contents)} contents over history "
        f"(! not tolerated); a revision, once committed, names one content forever: "
        f"bump it in the commit that changes the line (python -m tpfix.maint.revision bump "
        f'{v.tag} "what changed, for users")\n' + "\n".join(f"      {r}" for r in rows)
    )


def history_problems(repo: Path = ROOT, rev: str = "HEAD") -> list[str]:
    """What is wrong with the revisions over the history of `rev` ([] when nothing)."""
    return history_violations(repo, rev)[1]


def record(violations: list[Violation], through: str) -> str:
    """EXCEPTIONS' text tolerating `violations` up to commit `through`."""
    out = [
        "# Revisions that named more than one content before the history check",
        "# (tpfix.maint.revision history_problems) existed: patches were edited under",
        "# a revision already committed.  The past cannot be rewritten; these are",
        "# tolerated exactly, in `through` and its ancestors only.  Never add one.",
        f'through = "{through}"',
    ]
    for v in violations:
        out += ["", "[[revision]]", f'version = "{v.version}"', "fingerprints = ["]
        for c in v.contents:
            out.append(
                f'    "{c.fingerprint}",  # from {c.commits[0].short}, {len(c.commits)} commit(s)'
            )
        out.append("]")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bump", help="increment the line's revision, with a changelog entry")
    b.add_argument("tag", choices=line_names())
    b.add_argument("what", help="what the new revision changes, for users")
    c = sub.add_parser("check", help="every line's revision matches what it ships, over history")
    c.add_argument("tag", nargs="?", choices=line_names())
    h = sub.add_parser("history", help="every revision that named more than one content")
    h.add_argument("--record", action="store_true", help=f"print {EXCEPTIONS} for them")
    args = ap.parse_args()
    if args.command == "history":
        found, problems = history_violations()
        if args.record:
            print(record(found, _git(ROOT, "rev-parse", "HEAD").strip()), end="")
            return
        for v in found:
            print(_said(v))
        if problems:
            raise Fail("\n  ".join(p.splitlines()[0] for p in problems))
        print(f"{len(found)} revision(s) named more than one content, each as {EXCEPTIONS} records")
        return
    if args.command == "bump":
        line = get_line(args.tag)
        print(f"{shown(line.version_file)}: {bump(line, args.what)}")
        if update_readme():  # its versions table names each line's wheel and image
            print(f"{shown(README)}: versions table updated")
        return
    wrong = [
        p
        for t in ([args.tag] if args.tag else line_names())
        for p in revision_problems(get_line(t))
    ]
    wrong += history_problems()
    if wrong:
        raise Fail("\n  ".join(wrong))
    print(
        "every line's revision matches what it ships, and no committed revision names other "
        f"content than it first did (but as {EXCEPTIONS} records)"
    )


if __name__ == "__main__":
    main_wrapper(main)
