# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The texts maint.export writes beside the mails: each patch's
pull-request description (vLLM's template: Overview, Claims, Validation with
the results of maint.validation, Details, checklist) and SUBMIT.md, what only
the submitter can do before opening them.
"""

from __future__ import annotations

import re
import sys

from tpfix.core.lines import get_line, read_pin_file
from tpfix.maint.commits import Mail

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


def _flashinfer(tag: str) -> str:
    """The FlashInfer the tests ran with: the one `tag` pins, or the line's
    re-pin where the index lacks it (pins.toml `flashinfer-repinned`)."""
    facts = read_pin_file(get_line(tag).pins)
    if repinned := facts.get("flashinfer-repinned"):
        return (
            f"FlashInfer {repinned}, where {tag} pins {facts['flashinfer']} (our "
            "distribution re-pins it; the patch does not depend on it)"
        )
    return f"FlashInfer {facts['flashinfer']}, the release {tag} pins"


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
    fixes = fixed_issues(mail, numbers)
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
        f"by a pytest plugin; {_flashinfer(tag)}, its workspace objects built "
        "without GPU memory.",
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


def fixed_issues(mail: Mail, numbers: dict[str, int] | None) -> list[str]:
    """`#N` of each upstream issue the patch fixes: its `Fixes:` trailers'
    vLLM issues, then each `Issue:` filed upstream as number N (`numbers`)."""
    return _fixes(mail) + _filed(mail, numbers)


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
