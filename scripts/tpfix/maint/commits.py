# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The forward-ported series as git commits, for maint.export: a patch
header as vLLM's commit message (Mail: From:, Date:, Subject:, the body, the
trailers vLLM takes; the fields only this distribution reads dropped), the
git repository of a pristine release sdist (one reproducible commit), and a
patch committed onto it.  Also used by tests/test_upstream_port.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tpfix.core.lines import sdist_pin
from tpfix.core.patch_format import Header, parse_header, split
from tpfix.core.util import Fail, cache_dir
from tpfix.stages.patch import pristine_tree

# Header fields that only this distribution reads (DEP-3 and our own, see
# patch_format): they stay in the quilt headers and are left out of the upstream
# commits.  Vendor bug fields (Bug-<Vendor>:) are left out too.
DISTRO_ONLY = {
    "forwarded",
    "origin",
    "last-update",
    "applied-upstream",
    "related",
    "scenario",
    "claim",
    "issue",
}
# DEP-3 fields the commit message carries under vLLM's trailer name.
AS_TRAILER = {"bug": "Fixes"}
# Commit identity and date of the pristine import commit: fixed, so the
# pristine commit and every exported mail are reproducible.
IMPORT_IDENT = ("vLLM release import", "release-import@example.invalid")
IMPORT_DATE = "2000-01-01T00:00:00+00:00"


# -- headers -> commits ------------------------------------------------------------


@dataclass
class Mail:
    author: str
    date: str  # RFC 2822
    subject: str
    body: str
    trailers: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)

    def message(self) -> str:
        trailers = "".join(f"{k}: {v}\n" for k, v in self.trailers)
        return f"{self.subject}\n\n{self.body.strip()}\n\n{trailers}"

    def values(self, key: str) -> list[str]:
        """Every value of header field `key`, kept as a trailer or dropped."""
        return [v for k, v in self.trailers + self.dropped if k.lower() == key.lower()]

    def trailer(self, key: str) -> str | None:
        values = self.values(key)
        return values[0] if values else None


def _distro_only(key: str) -> bool:
    return key.lower() in DISTRO_ONLY or key.lower().startswith("bug-")


def mail_of(header: Header, name: str = "?") -> Mail:
    """The commit of a patch header (patch_format.parse_header): From:, Date:,
    Subject: without its [PATCH] tag, the body, the trailers vLLM takes."""
    for key in ("from", "subject"):
        if header.mail_field(key) is None:
            raise Fail(f"{name}: header has no {key.title()}: line")
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", header.mail_field("subject") or "")
    kept = [(AS_TRAILER.get(k.lower(), k), v) for k, v in header.trailers if not _distro_only(k)]
    dropped = [(k, v) for k, v in header.trailers if _distro_only(k)]
    date = header.mail_field("date") or "Thu, 01 Jan 2026 00:00:00 +0000"
    return Mail(header.mail_field("from") or "", date, subject, header.body, kept, dropped)


def with_author(mail: Mail, author: str) -> Mail:
    """The mail as sent by `author` ("Name <email>"): From and Signed-off-by."""
    old = mail.author
    trailers = [
        (k, author if k.lower() == "signed-off-by" and v == old else v) for k, v in mail.trailers
    ]
    if ("Signed-off-by", author) not in trailers:
        trailers.append(("Signed-off-by", author))
    return Mail(author, mail.date, mail.subject, mail.body, trailers, mail.dropped)


def parse_ident(author: str) -> tuple[str, str]:
    """(name, email) of "Name <email>"; a Fail for anything else."""
    m = re.match(r"^\s*(.*?)\s*<([^>]+)>\s*$", author)
    if not m:
        raise Fail(f"author {author!r} is not 'Name <email>'")
    return m.group(1), m.group(2)


# -- git -------------------------------------------------------------------------------


def git(repo: Path, *args: str, env: dict | None = None, check: bool = True, input=None):
    full = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, **(env or {}))
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], text=True, capture_output=True, env=full, input=input
    )
    if check and proc.returncode != 0:
        raise Fail(f"git {' '.join(args[:3])} failed in {repo}:\n{proc.stderr.strip()[-2000:]}")
    return proc


def _as(name: str, email: str, date: str) -> dict:
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": date,
    }


def pristine_git(tag: str) -> Path:
    """A bare git repository holding pristine `tag` as one commit, cached.

    Made once per sdist (fetched and verified like any tree) under
    <cache>/git/; every file of the sdist is committed, the ones its
    .gitignore names too.  Its commit id is reproducible (fixed identity and
    date).
    """
    pin = sdist_pin(tag)
    dest = cache_dir() / "git" / f"{pin.sha256[:16]}.git"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pristine.", dir=dest.parent) as tmp:
        tree = pristine_tree(Path(tmp) / "vllm", tag)
        git(tree, "init", "-q", "-b", "main")
        git(tree, "add", "-A", "-f", ".")
        name, email = IMPORT_IDENT
        git(
            tree,
            "commit",
            "-q",
            "--no-verify",
            "-m",
            f"vLLM {tag} (pristine sdist)",
            env=_as(name, email, IMPORT_DATE),
        )
        bare = Path(tmp) / "bare.git"
        git(tree, "clone", "-q", "--bare", str(tree), str(bare))
        try:
            os.replace(bare, dest)
        except OSError:  # made concurrently by another process
            if not dest.exists():
                raise
    return dest


def pristine_repo(tag: str, dest: Path, checkout: bool = True) -> Path:
    """`dest`: a git clone of pristine `tag` (see pristine_git), checked out
    unless `checkout` is False (then only the index is populated)."""
    args = ["clone", "-q", "--shared"] + ([] if checkout else ["--no-checkout"])
    git(dest.parent, *args, str(pristine_git(tag)), str(dest))
    if not checkout:
        git(dest, "read-tree", "HEAD")
    return dest


def commit_patch(
    repo: Path, patchfile: Path, author: str | None = None, index_only: bool = False
) -> Mail:
    """Apply `patchfile` (quilt format, -p1) to `repo` and commit it with its
    header; `index_only` for a clone without a checkout."""
    header, diff = split(patchfile.read_text())
    mail = mail_of(parse_header(header, patchfile.name), patchfile.name)
    if author:
        mail = with_author(mail, author)
    where = "--cached" if index_only else "--index"
    proc = git(repo, "apply", where, "--whitespace=nowarn", "-", input=diff, check=False)
    if proc.returncode != 0:
        raise Fail(f"{patchfile.name}: git apply failed: {proc.stderr.strip()[-1500:]}")
    name, email = parse_ident(mail.author)
    git(
        repo,
        "commit",
        "-q",
        "--no-verify",
        "-F",
        "-",
        input=mail.message(),
        env=_as(name, email, mail.date),
    )
    return mail


def commit_id(repo: Path) -> str | None:
    """The upstream commit the sdist was made from (vllm/_version.py)."""
    proc = git(repo, "show", "HEAD:vllm/_version.py", check=False)
    m = re.search(r"__commit_id__ = commit_id = '(?:g)?([0-9a-f]+)'", proc.stdout)
    return m.group(1) if m else None
