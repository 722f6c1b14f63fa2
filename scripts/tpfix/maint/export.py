# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Export the forward-ported series as mails and pull-request descriptions.

    python -m tpfix.maint.export             # newest line, patches/v0.33.0 -> build/export/v0.33.0/
    python -m tpfix.maint.export v0.33.0 --out DIR --signoff "Jane Doe <jane@example.com>"
    python -m tpfix.maint.export --no-tests       # skip the validation runs (placeholders)

For patches/TAG/series (a release line: the reviewed forward port, see maint.rebase) it
checks that the series applies exactly to pristine TAG, then builds a git
repository from the pristine TAG sdist (one commit), commits each patch that
goes upstream (all but `Forwarded: not-needed` ones, e.g. a re-pin) with
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

The commits and the pristine repository are maint.commits', the validation
runs maint.validation's, the pull-request texts and SUBMIT.md maint.pr_text's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from tpfix.core.lines import get_line, newest_line
from tpfix.core.patch_format import read_patch, read_series
from tpfix.core.util import ROOT, Fail, main_wrapper
from tpfix.maint.commits import commit_id, commit_patch, git, parse_ident, pristine_repo
from tpfix.maint.pr_text import fixed_issues, pr_description, submit_steps
from tpfix.maint.validation import multi_gpu_tests, validate
from tpfix.stages.patch import cached_tree

# Upstream exports come from the newest release line.
DEFAULT_TAG = newest_line()
# The upstream issue texts that `Issue: <id>` header fields name.
ISSUES = ROOT / "docs" / "upstream"


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
    domain = parse_ident(given)[1].rpartition("@")[2].lower().rstrip(".")
    if domain.endswith(RESERVED_TLDS) or domain.endswith(RESERVED_DOMAINS):
        raise Fail(
            f"export: {given} is a placeholder (a reserved domain, RFC 2606, that no "
            f"mail reaches), which vLLM's DCO check rejects: {how}"
        )
    return given


# RFC 2606 / RFC 6761: names that no one's mail address can be on.
RESERVED_TLDS = (".invalid", ".example", ".test", ".localhost")
RESERVED_DOMAINS = ("example.com", "example.net", "example.org")


# -- the whole export ------------------------------------------------------------------


def mailed(series: Path) -> list[str]:
    """The patches of `series` that go upstream, in order: all but those whose
    header says `Forwarded: not-needed` (the distribution's own, such as a
    re-pin of a dependency the index lacks); the others must apply without them."""
    names = read_series(series)
    return [
        n for n in names if read_patch(series.parent / n).header.get("Forwarded") != "not-needed"
    ]


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
    names = mailed(series)
    if not names:
        raise Fail(f"{series}: the series has no patch to send upstream")
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
                "fixes": fixed_issues(mail, numbers) + [f"issue-{i}" for i in mail.values("Issue")],
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
