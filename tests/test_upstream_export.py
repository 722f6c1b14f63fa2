# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The newest line's export upstream (scripts/tpfix/maint/export.py): one
mail and one pull-request description per port; the mails apply with `git
am` to a git repository made from the pristine tag and give the ported tree;
the descriptions follow vLLM's template, with `Fixes #...` from `Bug:` and
the Claims from the `Claim:` fields.  The line is the data's
(tests/port_line.py), as in test_upstream_port.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpfix.core.lines import line_names
from tpfix.core.patch_format import read_patch, read_series
from tpfix.maint.commits import git, pristine_repo
from tpfix.maint.export import export
from tpfix.maint.pr_text import _why_red
from tpfix.maint.validation import multi_gpu_tests, pytest_outcome

# exports the newest line and applies its mails to the pristine tag
pytestmark = pytest.mark.slow

if len(line_names()) < 2:
    pytest.skip(
        "no release line besides the default: nothing forward-ported", allow_module_level=True
    )
from port_line import FIXES, MAILED, PORT, SIGNOFF, TAG, port_tree  # noqa: E402 (after the skip)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("export") / TAG
    return out, export(TAG, out, SIGNOFF, run_tests=False)


def test_export_gives_one_mail_and_one_description_per_port(exported):
    out, rep = exported
    assert [p["name"] for p in rep["patches"]] == MAILED
    # the distribution's own patches (a re-pin: Forwarded: not-needed) stay home
    for name in set(read_series(PORT / "series")) - set(MAILED):
        assert read_patch(PORT / name).header.get("Forwarded") == "not-needed", name
    mails = sorted(p.name for p in out.glob("*.patch"))
    assert mails == [p["mail"] for p in rep["patches"]]
    descriptions = sorted(p.name for p in out.glob("0*.md"))  # not issue-*.md, SUBMIT.md
    assert descriptions == [p["pr"] for p in rep["patches"]]
    for n, p in enumerate(rep["patches"], start=1):
        assert p["mail"].startswith(f"{n:04d}-") and p["pr"] == p["mail"][: -len("patch")] + "md"
    assert json.loads((out / "validation.json").read_text())["patches"] == rep["patches"]


def test_export_command_prints_the_files(tmp_path):
    """The command (`python -m tpfix.maint.export TAG --no-tests`) prints
    each mail and its description, in series order."""
    out = tmp_path / "export"
    proc = subprocess.run(
        [sys.executable, "-m", "tpfix.maint.export", TAG, "--no-tests", "--out", str(out)]
        + ["--signoff", SIGNOFF],
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = proc.stdout.split()
    issues = sorted({f for n in MAILED for f in FIXES[n] if f.startswith("issue-")})
    assert len(printed) == 2 * len(MAILED) + len(issues)
    assert [Path(p).suffix for p in printed] == [".patch", ".md"] * len(MAILED) + [".md"] * len(
        issues
    )
    assert [Path(p).stem for p in printed[2 * len(MAILED) :]] == issues
    assert all(Path(p).is_file() and Path(p).parent == out for p in printed)


def test_exported_mails_apply_with_git_am(exported, tmp_path):
    out, rep = exported
    mails = [out / p["mail"] for p in rep["patches"]]
    assert len(mails) == len(MAILED)
    repo = pristine_repo(TAG, tmp_path / "vllm")
    git(repo, "config", "user.name", "CI")
    git(repo, "config", "user.email", "ci@example.invalid")
    # --keep-non-patch: keep vLLM's "[Bugfix][...]" title tags, strip "[PATCH n/m]"
    proc = git(repo, "am", "--keep-non-patch", *map(str, mails), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = git(repo, "log", "--format=%s", "-n", str(len(mails))).stdout.splitlines()
    assert log[::-1] == [p["subject"] for p in rep["patches"]]
    # the result is the ported tree, file for file
    changed = git(repo, "diff", "--name-only", "HEAD~" + str(len(mails)), "HEAD").stdout.split()
    assert changed
    for f in changed:
        assert (repo / f).read_bytes() == (port_tree() / f).read_bytes(), f


def test_exported_mails_are_format_patch_mails(exported):
    out, rep = exported
    m = len(rep["patches"])
    for n, p in enumerate(rep["patches"], start=1):
        text = (out / p["mail"]).read_text()
        assert re.match(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001\n", text)
        assert re.search(r"^From: .+ <.+@.+>$", text, re.M)
        assert re.search(r"^Date: \w{3}, \d+ \w{3} \d{4} ", text, re.M)
        assert f"Subject: [PATCH {n}/{m}] [" in text
        assert re.search(rf"^Signed-off-by: {re.escape(SIGNOFF)}$", text, re.M)
        assert re.search(rf"^From: {re.escape(SIGNOFF)}$", text, re.M)
        assert ".invalid" not in text, p["name"]
        bug = read_patch(PORT / p["name"]).header.get("Bug")
        fixes = re.findall(r"^Fixes: (.+)$", text, re.M)
        assert fixes == ([bug] if bug else []), p["name"]
        for field in ("Forwarded", "Related", "Scenario", "Claim", "Bug", "Issue"):
            assert not re.search(rf"^{field}:", text, re.M), (p["name"], field)
        assert p["fixes"] == FIXES[p["name"]]


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_pr_descriptions_follow_vllms_template(exported):
    out, rep = exported
    for p in rep["patches"]:
        text = (out / p["pr"]).read_text()
        header = read_patch(PORT / p["name"]).header
        titles = re.findall(r"^## (.+)$", text, re.M)
        assert titles[:4] == ["Overview", "Claims", "Validation", "Details"], titles
        overview = _section(text, "Overview")
        for f in FIXES[p["name"]]:  # Fixes only what it fixes
            said = f"`{f}.md`" if f.startswith("issue-") else f"Fixes {f}."
            assert said in overview, (p["name"], f)
        if not FIXES[p["name"]]:
            assert "Fixes" not in overview, p["name"]
        for related in header.get_all("Related"):
            assert f"Related: {related}" in _section(text, "Details"), p["name"]
        claims = header.get_all("Claim")
        assert claims, f"{p['name']}: no Claim: fields"
        bullets = re.findall(r"^- (.+)$", _section(text, "Claims"), re.M)
        assert bullets == claims, p["name"]
        assert header.body.strip() in _section(text, "Details")
        assert "Pull Request Checklist" in text
        assert "- [x] AI assistance was used" in text
        gpu = multi_gpu_tests(PORT / p["name"])
        assert p["multi_gpu_tests"] == gpu
        for test in gpu:  # named as not run here, for upstream's multi-GPU CI
            assert f"  - `{test}`" in _section(text, "Validation"), p["name"]


def test_export_writes_the_upstream_issues(exported):
    """One issue text per `Issue:` field, as docs/upstream/ holds it."""
    out, rep = exported
    issues = sorted({f for n in MAILED for f in FIXES[n] if f.startswith("issue-")})
    assert rep["issues"] == [f"{i}.md" for i in issues]
    root = Path(__file__).resolve().parents[1]
    for i in issues:
        text = (out / f"{i}.md").read_text()
        assert text == (root / "docs" / "upstream" / f"{i[len('issue-') :]}.md").read_text()
        assert text.startswith("# [")


def test_a_red_run_says_which_failures_show_the_bug():
    """The PR text tells tests red for the bug from those red only because
    what they call does not exist yet (an AttributeError on the old tree)."""
    out = pytest_outcome(
        "==== FAILURES ====\n"
        "____ test_a[2048] ____\n    def test_a():\n>       f()\n"
        "E       ValueError: Workspace validation failed:\nE         - token_num\n"
        "____ test_b ____\nE       AttributeError: module has no attribute 'f'\n"
        "____ test_c ____\nE       AttributeError: y\n"
        "____ test_d ____\nE       assert None is <Mock id=1>\n"
        "==== short test summary info ====\n"
        "FAILED t.py::test_a[2048]\nFAILED t.py::test_b\nFAILED t.py::test_c\n"
        "FAILED t.py::test_d\n"
        "==== 4 failed in 1.0s ===="
    )
    assert out["failure_kinds"] == {"AssertionError": 1, "AttributeError": 2, "ValueError": 1}
    assert _why_red(out) == (
        "(red: 2 of them on the bug itself, 2 only because what they call is new; "
        "1 AssertionError, 2 AttributeError, 1 ValueError)"
    )
    one = "== FAILURES ==\n___ test_a ___\nE   ValueError: x\n== 1 failed in 1s =="
    assert _why_red(pytest_outcome(one)) == "(red, as expected)"


def test_export_says_fixes_with_the_filed_issue_number(tmp_path):
    """Once an issue text is filed (--issue NAME=NUMBER), the PR that fixes it
    says "Fixes #NUMBER" instead of asking the submitter to file it; a name
    the series has no Issue: for is refused."""
    from tpfix.core.util import Fail

    out = tmp_path / "export"
    rep = export(TAG, out, SIGNOFF, run_tests=False, numbers={"fusion-workspace-crash": 54321})
    # the PR of the patch with that Issue: (a re-pin or port to it may come first)
    (fixing,) = [p for p in rep["patches"] if "#54321" in p["fixes"]]
    first = (out / fixing["pr"]).read_text()
    assert "Fixes #54321." in first and "file it first" not in first
    steps = (out / "SUBMIT.md").read_text()
    assert "issue-lost-fusion.md" in steps and "issue-fusion-workspace-crash" not in steps
    assert "Duplicate" not in first and "/pr-checklist" in steps
    others = [(out / p["pr"]).read_text() for p in rep["patches"] if p is not fixing]
    assert not any("#54321" in t for t in others)
    with pytest.raises(Fail, match="no Issue: nonsuch"):
        export(TAG, tmp_path / "x", SIGNOFF, run_tests=False, numbers={"nonsuch": 1})


def test_export_refuses_a_placeholder_signoff(tmp_path, monkeypatch):
    """The export refuses to sign off mails with a placeholder (an .invalid
    address, as the headers have) or with no identity at all (no --signoff,
    no git identity), which vLLM's DCO check rejects, and writes nothing."""
    import tpfix.maint.export as export_module
    from tpfix.core.util import Fail

    out = tmp_path / "export"
    for placeholder in (
        "vLLM tpfix maintainers <maintainers@tpfix.invalid>",
        "Seed maintainers <maintainers@users.noreply.a-seed.example>",
        "Someone <someone@example.com>",
    ):
        with pytest.raises(Fail, match="placeholder"):
            export(TAG, out, placeholder, run_tests=False)
        assert not out.exists()
    monkeypatch.setattr(export_module, "ROOT", tmp_path)  # no repository, no identity
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "none"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    with pytest.raises(Fail, match="Signed-off-by"):
        export(TAG, out, None, run_tests=False)
    assert not out.exists()
