# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Export the forward-ported series as mails and pull-request descriptions.

    python -m tpfix.maint.export             # newest line, patches/v0.33.0 -> build/export/v0.33.0/
    python -m tpfix.maint.export v0.33.0 --out DIR --signoff "Jane Doe <jane@example.com>"
    python -m tpfix.maint.export --no-tests       # skip the validation runs (placeholders)

For patches/TAG/series (a release line: the reviewed forward port, see maint.rebase) it
checks that the series applies exactly to pristine TAG, then builds a git
repository from the pristine TAG sdist (one commit), commits each patch with
its header (patch_format) as the commit message: author and date from its
From:/Date:, the body, and the trailers vLLM takes (DEP-3's `Bug:` becomes
the `Fixes:` trailer; the fields only this distribution reads, DISTRO_ONLY
such as Forwarded:, Related:, Scenario:, Claim:, Issue:, are dropped).  Then
it runs `git format-patch --numbered`.  OUT gets:

  NNNN-<subject>.patch  the mails, [PATCH n/m], with Signed-off-by (vLLM's DCO)
  NNNN-<subject>.md     the pull-request description, vLLM's template
                        (.github/PULL_REQUEST_TEMPLATE.md of TAG: Overview,
                        Claims (the header's `Claim:` fields), Validation,
                        Details, checklist), with the root cause, the test
                        plan, the results measured here, `Fixes #...` and
                        the header's `Related:` references
  issue-<id>.md         the upstream issue each `Issue: <id>` field names,
                        to be filed before the pull request that fixes it
                        (docs/upstream/<id>.md); its PR says "Fixes" for it
  validation.json       those results, machine-readable
  SUBMIT.md             what only the submitter can do before opening them
                        (file the issues, the duplicate-work search, the
                        agents' checklist, the multi-GPU tests)

Validation (unless --no-tests), per patch, on TAG + the ports before it:
the vLLM tests the patch adds or changes (pytest, on CPU with the compiled
torch.ops._C ops stood in by tpfix/replay/vllm_cpu_stubs.py), with the patch
(must pass) and without it (the same test files copied in: must fail), and
the patch's scenario checks (the `Scenario:` fields of its header,
replay.harness.patch_checks) red without / green with it.  A failed
expectation stops the export.  Tests the patch adds under a several-GPU mark
(@multi_gpu_only, @multi_gpu_test) skip on this host ("Need at least N
GPUs"); the description names them as not run, for vLLM's multi-GPU CI.

The DCO needs the submitter's real name: the From: and Signed-off-by: of the
mails are the submitter's, `--signoff "Name <email>"` or else the git
identity of this checkout (git config user.name / user.email); the headers'
distribution identity is a placeholder, and the export refuses to write
mails signed off by a placeholder (an .invalid address) or by nobody.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tpfix.lines import Line, get_line, newest_line, sdist_pin
from tpfix.patch import cached_tree, pristine_tree
from tpfix.patch_format import Header, diff_files, parse_header, read_patch, read_series, split
from tpfix.replay.harness import patch_checks, run_check
from tpfix.util import ROOT, Fail, cache_dir, main_wrapper

# Upstream exports come from the newest release line.
DEFAULT_TAG = newest_line()
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
# The upstream issue texts that `Issue: <id>` header fields name.
ISSUES = ROOT / "docs" / "upstream"
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


def signoff_identity(given: str | None = None) -> str:
    """The submitter's "Name <email>" for From: and Signed-off-by: `given`, or
    the git identity of this checkout; a Fail for none or a placeholder."""
    how = "pass --signoff 'Name <email>' or set git config user.name and user.email"
    if not given:
        name, email = (
            subprocess.run(
                ["git", "-C", str(ROOT), "config", key], capture_output=True, text=True
            ).stdout.strip()
            for key in ("user.name", "user.email")
        )
        if not (name and email):
            raise Fail(f"export: the mails need the submitter's Signed-off-by: {how}")
        given = f"{name} <{email}>"
    domain = _ident(given)[1].rpartition("@")[2].lower().rstrip(".")
    if domain.endswith(RESERVED_TLDS) or domain.endswith(RESERVED_DOMAINS):
        raise Fail(
            f"export: {given} is a placeholder (a reserved domain, RFC 2606, that no "
            f"mail reaches), which vLLM's DCO check rejects: {how}"
        )
    return given


# RFC 2606 / RFC 6761: names that no one's mail address can be on.
RESERVED_TLDS = (".invalid", ".example", ".test", ".localhost")
RESERVED_DOMAINS = ("example.com", "example.net", "example.org")


def _ident(author: str) -> tuple[str, str]:
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
    name, email = _ident(mail.author)
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


# -- validation ------------------------------------------------------------------------


def vllm_tests(patchfile: Path) -> list[str]:
    """tests/**/test_*.py files the patch adds or changes (vLLM's own layout)."""
    files = diff_files(patchfile)
    return sorted(d.new for d in files if d.new and re.match(r"tests/(.+/)?test_[^/]+\.py$", d.new))


# vLLM's marks for a test that needs several GPUs (tests/utils.py): it skips
# with "Need at least N GPUs" on a smaller host; upstream's multi-GPU CI runs it.
_GPU_MARK = re.compile(r"@multi_gpu_(?:only|test)\(")
_DEF = re.compile(r"(?:async )?def (\w+)")


def multi_gpu_tests(patchfile: Path) -> list[str]:
    """`file::function` of each test the patch adds under a several-GPU mark
    (@multi_gpu_only, @multi_gpu_test), in vLLM's tests/ layout."""
    found, current, marked = [], None, False
    for line in split(patchfile.read_text())[1].splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].split("/", 1)[-1]
            current = path if re.match(r"tests/(.+/)?test_[^/]+\.py$", path) else None
            marked = False
        elif current is None or not line.startswith("+"):
            continue
        elif line.startswith("+@"):
            marked = marked or bool(_GPU_MARK.match(line[1:]))
        elif m := _DEF.match(line[1:]):
            if marked and m.group(1).startswith("test_"):
                found.append(f"{current}::{m.group(1)}")
            marked = False
    return found


# vLLM's tests/conftest.py cleans up after every test not marked
# skip_global_cleanup with torch.accelerator.empty_cache(), which raises on a
# host without an accelerator: a teardown error of a test that passed, not a
# failure of the code under test.
CPU_TEARDOWN = "RuntimeError: Cannot access accelerator device when none is available"


def _no_warnings(summary: str) -> str:
    """'1 passed, 2 warnings in 3s' -> '1 passed in 3s'."""
    counts, sep, rest = summary.partition(" in ")
    kept = [c for c in counts.split(", ") if not re.fullmatch(r"\d+ warnings?", c)]
    return ", ".join(kept) + sep + rest


def pytest_outcome(stdout: str) -> dict:
    """Counts of a `pytest -rfEs` run; `green`: something passed, nothing
    failed, and the only errors are CPU_TEARDOWN ones; `red`: a test failed."""
    lines = [x for x in stdout.strip().splitlines() if x.strip()]
    summary = lines[-1].strip("= ") if lines else ""
    count = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
    errors = count.get("error", 0) + count.get("errors", 0)
    # the long report: one "_ ERROR at <when> of <test> _" section per error
    sections = re.split(r"^_+ ERROR at ", stdout, flags=re.M)[1:]
    benign = sum(
        1
        for sec in sections
        if sec.startswith("teardown of ")
        and CPU_TEARDOWN in re.split(r"^(?:_{3,}|={3,}) ", sec, maxsplit=1, flags=re.M)[0]
    )
    out = {
        "summary": _no_warnings(summary),
        "passed": count.get("passed", 0),
        "failed": count.get("failed", 0),
        "skipped": count.get("skipped", 0),
        "errors": errors,
        "cpu_teardown_errors": benign,
        "skip_reasons": sorted(set(re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", stdout, re.M))),
        "failure_kinds": _failure_kinds(stdout),
    }
    out["green"] = out["passed"] > 0 and out["failed"] == 0 and errors == benign
    out["red"] = out["failed"] > 0 or errors > benign
    return out


def _failure_kinds(stdout: str) -> dict[str, int]:
    """How many failed tests raised each exception type: the first `E   Type:`
    line of each test's section of the FAILURES report."""
    report = stdout.partition("= FAILURES =")[2].partition("short test summary info")[0]
    kinds = []
    for section in re.split(r"^_+ \S+ _+$", report, flags=re.M)[1:]:
        first = re.search(r"^E\s+(.*)$", section, re.M)
        line = first.group(1) if first else ""
        if line.startswith("assert "):  # pytest's rewritten assert
            kinds.append("AssertionError")
        else:
            m = re.match(r"(?:\w+\.)*(\w+)(?::|$)", line)
            kinds.append(m.group(1) if m else "other")
    return dict(sorted(Counter(kinds).items()))


def run_pytest(tree: Path, files: list[str]) -> dict:
    from tpfix.replay.harness import run_vllm_tests

    proc = run_vllm_tests(tree, files, "-q", "-rfEs")
    res = pytest_outcome(proc.stdout)
    res["rc"] = proc.returncode
    if not res["summary"]:
        res["summary"] = proc.stderr.strip()[-300:]
    return res


def with_files(tree: Path, source: Path, files: list[str], dest: Path) -> Path:
    """`dest` = `tree` with `files` taken from `source`: a hard-linked copy
    (fast, and the cached `tree` is never written: replaced files are
    unlinked first)."""
    shutil.copytree(tree, dest, symlinks=True, copy_function=os.link)
    for f in files:
        (dest / f).unlink(missing_ok=True)
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / f, dest / f)
    return dest


def validate(line: Line, name: str) -> dict:
    """Red without `name` (on the line's tag + the ports before it), green with it."""
    patches = line.patches
    names = read_series(line.series)
    i = names.index(name)
    before = cached_tree(line, names[i - 1] if i else "")
    after = cached_tree(line, name)
    res: dict = {"tests": [], "checks": []}
    files = vllm_tests(patches / name)
    if files:
        green = run_pytest(after, files)
        with tempfile.TemporaryDirectory() as tmp:
            red = run_pytest(with_files(before, after, files, Path(tmp) / "vllm"), files)
        res["tests"].append({"files": files, "with": green, "without": red})
        if not green["green"]:
            raise Fail(f"{name}: its tests fail with the patch: {green['summary']}")
        if not red["red"]:
            raise Fail(f"{name}: its tests pass without the patch: {red['summary']}")
        gpu = multi_gpu_tests(patches / name)
        if gpu and not any(r.startswith("Need at least") for r in green["skip_reasons"]):
            raise Fail(f"{name}: {', '.join(gpu)} did not skip for want of GPUs: {green}")
    for check in patch_checks(patches / name):
        entry = {
            "spec": check.spec,
            "why": check.why,
            "without": run_check(before, check),
            "with": run_check(after, check),
        }
        res["checks"].append(entry)
        if entry["with"]["passed"] is not True or entry["without"]["passed"] is not False:
            raise Fail(
                f"{name}: scenario {check.spec} is not red without / green with it: "
                f"{json.dumps(entry)[:1500]}"
            )
    return res


# -- pull-request description ------------------------------------------------------------


def _fixes(mail: Mail) -> list[str]:
    refs = []
    for _, v in [t for t in mail.trailers if t[0].lower() == "fixes"]:
        refs += [f"#{n}" for n in re.findall(r"vllm-project/vllm/issues/(\d+)", v)]
        refs += [f"#{n}" for n in re.findall(r"(?<![\w/])vllm#(\d+)", v)]
    return refs


def _said(run: dict) -> str:
    """A pytest outcome in words, benign CPU teardown errors named as such."""
    text = run["summary"]
    if run.get("cpu_teardown_errors"):
        text += (
            f" ({run['cpu_teardown_errors']} errors: teardown of upstream tests not "
            "marked skip_global_cleanup, torch.accelerator on a CPU-only host)"
        )
    if run.get("errors") and not run.get("passed") and not run.get("failed"):
        text += " (collection error: the tests import what the patch adds)"
    return text


def _scenario(result: dict) -> str:
    if "error" in result:
        return f"{result['error']}: {result.get('message', '')}"
    if "failures" in result:
        ex = (result.get("failure_examples") or [{}])[0].get("error", "")
        said = (
            f"{result['failures']} FlashInfer errors, {result.get('unfused', 0)} "
            f"unfused fallbacks in {result.get('checked')} calls"
        )
        return said + (f"; {ex}" if ex else "")
    return ""


def _result_lines(tag: str, val: dict | None, index: int) -> list[str]:
    if val is None:
        return ["- Not run by this export (`--no-tests`); run it without that option."]
    on = f"{tag} + PATCH 1..{index}" if index > 1 else f"{tag} + this patch"
    off = f"{tag} + PATCH 1..{index - 1}" if index > 1 else f"pristine {tag}"
    out = []
    for t in val["tests"]:
        cmd = " ".join(["pytest", *t["files"]])
        out += [
            f"- `{cmd}`",
            f"  - {on}: **{_said(t['with'])}**",
            f"  - {off} with only the new tests: {_said(t['without'])} {_why_red(t['without'])}",
        ]
    for c in val["checks"]:
        why = " ".join(_scenario(c["without"].get("result", {})).split())
        out += [
            f"- Scenario `{c['spec']}`: {c['why']}.",
            f"  - {off}: fails ({why[:400]})" if why else f"  - {off}: fails",
            f"  - {on}: passes",
        ]
    return out


# A test that fails for one of these before the patch fails because what it
# calls is new, not because it shows the bug.
NEW_API = ("AttributeError", "ImportError", "ModuleNotFoundError", "NameError")


def _why_red(run: dict) -> str:
    kinds = run.get("failure_kinds") or {}
    new = sum(n for k, n in kinds.items() if k in NEW_API)
    if not new:
        return "(red, as expected)"
    named = ", ".join(f"{n} {k}" for k, n in kinds.items())
    return (
        f"(red: {run['failed'] - new} of them on the bug itself, {new} only because "
        f"what they call is new; {named})"
    )


def _not_run_lines(gpu_tests: list[str]) -> list[str]:
    """What a CPU host cannot run: the tests the patch marks for several GPUs
    (they skip here), and the fused kernels on real GPUs."""
    if not gpu_tests:
        return [
            "- Not run: the fused kernels on GPUs (the multi-GPU tests of the "
            "touched files, `@multi_gpu_test`); to be run on GPUs before merge."
        ]
    return [
        "- Not run here (skipped: they need several GPUs, vLLM's multi-GPU CI "
        "runs them; to be checked there before merge):",
        *[f"  - `{t}`" for t in gpu_tests],
    ]


def _runtime() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "?"
    return f"Python {sys.version_info.major}.{sys.version_info.minor}, torch {torch}"


def pr_description(
    tag: str,
    n: int,
    m: int,
    name: str,
    mail: Mail,
    val: dict | None,
    base: str | None,
    template: str,
    gpu_tests: list[str] | None = None,
    numbers: dict[str, int] | None = None,
) -> str:
    fixes = _fixes(mail) + _filed(mail, numbers)
    claims = mail.values("Claim") or [mail.subject]
    based = f"`{tag}`" + (f" (commit {base})" if base else "")
    depends = f" Applies on top of PATCH 1..{n - 1} of this series." if n > 1 else ""
    related = mail.values("Related")
    issues = mail.values("Issue")
    lines = [
        f"# {mail.subject}",
        "",
        "<!-- markdownlint-disable -->",
        "",
        "## Overview",
        "",
        f"{mail.subject}. "
        + (" ".join(f"Fixes {r}" for r in fixes) + "." if fixes else "")
        + "".join(
            f" Fixes the issue filed from `issue-{i}.md` (file it first, then put its number here)."
            for i in issues
            if i not in (numbers or {})
        ),
        f"Against {based}, [PATCH {n}/{m}] of the exported series.{depends}",
        "",
        "## Claims",
        "",
        *[f"- {c}" for c in claims],
        "",
        "## Validation",
        "",
        "Test plan: each test below runs without the patch (must fail: it shows "
        f"the bug) and with it (must pass). Run on CPU ({_runtime()}): the "
        "compiled `torch.ops._C` ops that vLLM looks up at import are stood in "
        f"by a pytest plugin; FlashInfer is the release {tag} pins, its "
        "workspace objects built without GPU memory.",
        "",
        "Test results:",
        "",
        *_result_lines(tag, val, n),
        *_not_run_lines(gpu_tests or []),
        "",
        "## Details",
        "",
        mail.body.strip(),
        "",
    ]
    if related:
        lines += [f"Related: {r}" for r in related] + [""]
    checklist = template[template.find("---") :] if "---" in template else ""
    checklist = checklist.replace(
        "- [ ] AI assistance was used during the creation of this PR.",
        "- [x] AI assistance was used during the creation of this PR.",
    )
    return "\n".join(lines) + ("\n" + checklist.strip() + "\n" if checklist else "")


def _filed(mail, numbers: dict[str, int] | None) -> list[str]:
    """`#N` for each `Issue:` of `mail` that was filed upstream as number N."""
    return [f"#{numbers[i]}" for i in mail.values("Issue") if i in (numbers or {})]


def submit_steps(report: dict, numbers: dict[str, int]) -> str:
    """What only the submitter can do before opening the pull requests (the
    PR texts carry none of it): file the issues, check for duplicate work,
    run the agents' checklist and tick the template's boxes themselves."""
    unfiled = [i for i in report["issues"] if i[len("issue-") : -len(".md")] not in numbers]
    out = ["# Before opening these pull requests", ""]
    if unfiled:
        out += [
            "1. File " + ", ".join(f"`{i}`" for i in unfiled) + " upstream, then export "
            "again with `--issue NAME=NUMBER` for each, so that each PR says `Fixes #NUMBER`.",
        ]
    out += [
        "1. Check for duplicate work (vLLM's AGENTS.md), for each PR:",
        *[
            "   `gh pr list --repo vllm-project/vllm --state open --search "
            f'"{p["subject"]} in:title"`'
            for p in report["patches"]
        ],
        "1. Run `/pr-checklist` and tick the template's checklist in each PR text yourself.",
        "1. Have upstream's multi-GPU CI run the tests these PRs mark for several GPUs:",
        *[f"   `{t}`" for p in report["patches"] for t in p["multi_gpu_tests"]],
        "",
    ]
    return "\n".join(out)


# -- the whole export ------------------------------------------------------------------


def export(
    tag: str = DEFAULT_TAG,
    out: Path | None = None,
    signoff: str | None = None,
    run_tests: bool = True,
    numbers: dict[str, int] | None = None,
) -> dict:
    """`numbers`: the upstream issue number each filed `Issue:` text got."""
    author = signoff_identity(signoff)
    line = get_line(tag)
    series = line.series
    if not series.exists():
        raise Fail(f"{series}: no forward-ported series for {tag}")
    names = read_series(series)
    if not names:
        raise Fail(f"{series}: the series is empty")
    out = (out or ROOT / "build" / "export" / tag).resolve()
    # applies exactly (raises otherwise) and is cached for the validation runs
    cached_tree(line)
    validation = {n: validate(line, n) for n in names} if run_tests else {}
    issues = sorted(
        {i for n in names for i in read_patch(series.parent / n).header.get_all("Issue")}
    )
    for i in issues:
        if not (ISSUES / f"{i}.md").is_file():
            raise Fail(f"{series.parent}: Issue: {i} has no text {ISSUES / f'{i}.md'}")
    if unknown := sorted(set(numbers or {}) - set(issues)):
        raise Fail(
            f"export: --issue {unknown[0]}=N: the series has no Issue: {unknown[0]} "
            f"(it has: {', '.join(issues)})"
        )
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for i in issues:
        shutil.copyfile(ISSUES / f"{i}.md", out / f"issue-{i}.md")
    with tempfile.TemporaryDirectory(prefix="export.") as tmp:
        repo = pristine_repo(tag, Path(tmp) / "vllm", checkout=False)
        base = commit_id(repo)
        template = git(repo, "show", "HEAD:.github/PULL_REQUEST_TEMPLATE.md", check=False).stdout
        root = git(repo, "rev-parse", "HEAD").stdout.strip()
        mails = [commit_patch(repo, series.parent / n, author, index_only=True) for n in names]
        for name, mail in zip(names, mails, strict=True):
            if placeholders := [v for v in mail.values("Signed-off-by") if ".invalid>" in v]:
                raise Fail(f"{name}: Signed-off-by: {placeholders[0]} is a placeholder")
        proc = git(
            repo, "format-patch", "--numbered", "--no-signature", "-o", str(out), f"{root}..HEAD"
        )
        files = [Path(p) for p in proc.stdout.split()]
    report = {
        "tag": tag,
        "base_commit": base,
        "series": str(series),
        "issues": [f"issue-{i}.md" for i in issues],
        "patches": [],
    }
    for i, (name, mail, f) in enumerate(zip(names, mails, files, strict=True), start=1):
        pr = out / f.with_suffix(".md").name
        gpu_tests = multi_gpu_tests(series.parent / name)
        val = validation.get(name)
        pr.write_text(
            pr_description(tag, i, len(names), name, mail, val, base, template, gpu_tests, numbers)
        )
        report["patches"].append(
            {
                "name": name,
                "mail": f.name,
                "pr": pr.name,
                "subject": mail.subject,
                "author": mail.author,
                "fixes": _fixes(mail)
                + _filed(mail, numbers)
                + [f"issue-{i}" for i in mail.values("Issue")],
                "multi_gpu_tests": gpu_tests,
                "validation": val,
            }
        )
    (out / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "SUBMIT.md").write_text(submit_steps(report, numbers or {}))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "tag",
        nargs="?",
        default=DEFAULT_TAG,
        help="release line (patches/TAG/; default: the newest)",
    )
    ap.add_argument("--out", type=Path, help="output folder (default build/export/TAG)")
    ap.add_argument(
        "--signoff",
        "--author",
        dest="signoff",
        help="'Name <email>' for From: and Signed-off-by: (default: git config user.*)",
    )
    ap.add_argument("--no-tests", action="store_true", help="skip the validation runs")
    ap.add_argument(
        "--issue",
        action="append",
        default=[],
        metavar="NAME=NUMBER",
        help="the number upstream gave the filed issue-NAME.md: the PRs say Fixes #NUMBER",
    )
    args = ap.parse_args()
    numbers = {}
    for given in args.issue:
        name, _, number = given.partition("=")
        if not number.isdigit():
            raise Fail(f"export: --issue {given!r}: expected NAME=NUMBER, e.g. {name or 'X'}=54321")
        numbers[name] = int(number)
    report = export(args.tag, args.out, args.signoff, not args.no_tests, numbers)
    out = args.out or ROOT / "build" / "export" / args.tag
    for p in report["patches"]:
        print(f"{out / p['mail']}\n{out / p['pr']}")
    for i in report["issues"]:
        print(out / i)


if __name__ == "__main__":
    main_wrapper(main)
