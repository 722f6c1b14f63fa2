# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The newest release line, the forward port that goes upstream: rebase
report, forward port, export.  The line is taken from the data: the newest
folder of patches/ (tpfix.core.lines.line_names()), its source line the `from` of
its rebase.json (what python -m tpfix.maint.start_line wrote), so a line
started with start_line (and ported) is covered with no edit here.

* scripts/tpfix/maint/rebase.py classifies every patch of the source line's
  series on the newest tag (the report is produced here, as in CI); each
  patch's class must be the committed patches/<tag>/rebase.json's, each is
  checked by the scenarios its header names (the classification machinery,
  on small synthetic trees: test_rebase.py);
* patches/<tag>/ (the forward-ported series, its pins.toml) carries every
  patch that is not absorbed, under the same names, applies exactly to the
  pristine tag and refreshes to itself; each port keeps its fix's `Bug:`;
* each port is red without / green with it on the tag: the scenario its
  header names (`Scenario:`, run on trees of the tag with the FlashInfer the
  tag's pins.toml pins) and the vLLM tests it carries (the ones marked for
  several GPUs skip here, for exactly that reason);
* scripts/tpfix/maint/export.py gives one mail and one pull-request
  description per port; the mails apply with `git am` to a git repository
  made from the pristine tag and give the ported tree; the descriptions
  follow vLLM's template, with `Fixes #...` from `Bug:` and the Claims from
  the `Claim:` fields (test_upstream_export.py).

What a rebase showed beyond the classification (which files conflict and
why, what each check gave) and what each port must keep (its key lines, the
details of its scenarios) are data: patches/<tag>/port.toml
(tpfix/maint/port_facts.py), read for the line tested here; a line without
them fails.  Patches are named by the series files.
"""

from __future__ import annotations

import filecmp
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tpfix.core.lines import get_line, line_names, read_pin_file
from tpfix.core.patch_format import read_patch, split
from tpfix.core.quilt import Quilt
from tpfix.maint.port_facts import carried_by_name, fixes, mismatches
from tpfix.maint.rebase import format_table, rebase
from tpfix.maint.validation import multi_gpu_tests, pytest_outcome, vllm_tests, with_files
from tpfix.replay.harness import patch_checks, run_check, run_scenario, run_vllm_tests
from tpfix.stages.patch import pristine_tree

# downloads and patches the newest release, rebases, exports, replays its scenarios
pytestmark = pytest.mark.slow

if len(line_names()) < 2:
    pytest.skip(
        "no release line besides the default: nothing forward-ported", allow_module_level=True
    )
from port_line import (  # noqa: E402 (after the skip: the facts need a forward-ported line)
    COMMITTED,
    FACTS,
    FIXES,
    FROM,
    GPU_SKIP,
    NEW,
    PORT,
    PORTED,
    SOURCE,
    TAG,
    origin,
    port_tree,
    scenarios,
)


def both(first, second):
    """Run two independent subprocess-bound calls side by side (2 cores)."""
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(first), pool.submit(second)
        return a.result(), b.result()


def port_before(name: str) -> Path:
    i = PORTED.index(name)
    return port_tree(PORTED[i - 1] if i else "")


def _diff_of(patchfile: Path, path: str) -> list[str]:
    """The diff lines of file `path` in `patchfile` (its header not parsed)."""
    out, current = [], None
    for line in split(patchfile.read_text())[1].splitlines():
        if line.startswith("--- "):
            current = None
        elif line.startswith("+++ "):
            current = line[4:].split("\t")[0].split("/", 1)[-1]
        elif current == path:
            out.append(line)
    return out


# -- the rebase report FROM -> TAG ----------------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("rebase") / TAG
    rep = rebase(TAG, out, get_line(FROM))
    assert json.loads((out / "report.json").read_text()) == rep
    rep["_out"] = out
    print(format_table(rep))
    return rep


def _record(report: dict, name: str) -> dict:
    return next(r for r in report["patches"] if r["name"] == name)


def _merged(report: dict, name: str, path: str) -> str:
    return (report["_out"] / "conflicts" / name / path).read_text()


def _upstream_side(report: dict, name: str, path: str) -> str:
    """The target tag's side of every conflict of the diff3 merge of `path`."""
    text = _merged(report, name, path)
    return "".join(re.findall(r"^<<<<<<< target tag\n(.*?)^\|{7} ", text, re.M | re.S))


def test_report_covers_the_series_in_order(report):
    assert [r["name"] for r in report["patches"]] == SOURCE
    assert (report["from"], report["to"]) == (FROM, TAG)
    # the carried series is the patches that apply, as they are or refreshed
    applies = ("applies", "applies-with-changes")
    assert report["carried"] == [n for n in SOURCE if COMMITTED["patches"][n] in applies]


def test_committed_classification_is_the_reports(report):
    """patches/<tag>/rebase.json is what rebase.py reports now, in the format
    python -m tpfix.maint.start_line writes, from an older line."""
    assert line_names().index(FROM) < line_names().index(TAG), (FROM, TAG)
    expected = {
        "from": FROM,
        "to": TAG,
        "checks": True,
        "patches": {r["name"]: r["status"] for r in report["patches"]},
    }
    if "repins" in COMMITTED:  # start_line --repin, as given (its own patch)
        expected["repins"] = COMMITTED["repins"]
    assert expected == COMMITTED


def _conflict_hunks(rec: dict) -> dict[str, list[dict]]:
    hunks: dict[str, list[dict]] = {}
    for h in rec["hunks"]:
        hunks.setdefault(h["file"], []).append(h)
        if h["hunk"] is not None:
            assert h["hunk"] >= 1 and h["line"] >= 1 and h["header"].startswith("@@ "), h
    return hunks


def _discriminates(check: dict) -> bool:
    """Green on the target and red on the source tag before the patch."""
    return check["target"]["passed"] and check.get("pinned_before", {}).get("passed") is False


@pytest.mark.parametrize("name", SOURCE)
def test_each_patch_is_classified_by_itsscenarios(report, name):
    """Every patch of the source series gets its committed class, its
    `Scenario:` checks run on the target (unless it reverse-applies): an
    absorbed one is green there and red on the source tag before it; a
    conflicting one is not (a check red on the target needs no look back),
    lists its hunks and leaves a diff3 merge of each conflicting file; one
    that builds on an earlier conflicting patch names it.  What the rebase
    onto TAG showed beyond that is checked from port.toml."""
    rec = _record(report, name)
    assert rec["status"] == COMMITTED["patches"][name], rec["detail"]
    if rec.get("how") != "reverse-applies":
        assert [c["spec"] for c in rec["checks"]] == scenarios(name)
    for check in rec["checks"]:
        if not check["target"]["passed"]:
            assert "pinned_before" not in check, check
    if rec["status"] == "absorbed":
        assert rec["how"] in ("reverse-applies", "checks"), rec
        if rec["how"] == "checks":
            assert rec["checks"] and all(map(_discriminates, rec["checks"])), rec
        # a scenario that reports its FlashInfer: the pinned one, or the line's
        # re-pin where the index does not serve it (harness.pinned_flashinfer)
        facts = read_pin_file(PORT / "pins.toml")
        pinned = facts.get("flashinfer-repinned", facts.get("flashinfer"))
        for check in rec["checks"]:
            assert check["target"]["result"].get("flashinfer", pinned) == pinned, check
        assert name not in PORTED  # not carried forward
    if rec["status"] == "conflicts":
        assert not (rec["checks"] and all(map(_discriminates, rec["checks"]))), rec
        _conflict_hunks(rec)
        earlier = SOURCE[: SOURCE.index(name)]
        conflicting = {n for n in earlier if COMMITTED["patches"][n] == "conflicts"}
        assert set(rec["after_uncarried"]) <= conflicting, rec["after_uncarried"]
        assert rec["merge_conflicts"] or rec["after_uncarried"], rec
        for path in rec["merge_conflicts"]:  # a diff3 merge to resolve, or why there is none
            text = _merged(report, name, path)
            assert "<<<<<<< target tag" in text or "not in the target tag" in text, text
    _check_report_facts(report, rec, FACTS["report"][name])


def _check_report_facts(report: dict, rec: dict, facts: dict) -> None:
    """What port.toml says the rebase showed for this patch: the conflicts
    it builds on and the files left to merge, what the tag's side of them
    holds, each check's outcome on the tag (and on the source tag before
    the patch) and what its result holds."""
    why = f"{rec['name']}: {facts['why']}"
    if rec["status"] == "conflicts":
        assert list(rec["after_uncarried"]) == facts["after_uncarried"], why
        assert sorted(rec["merge_conflicts"]) == sorted(facts["conflicts"]), why
    for path, texts in facts.get("upstream_side", {}).items():
        side = _upstream_side(report, rec["name"], path)
        assert all(x in side for x in texts), (why, path, texts)
    assert [c["spec"] for c in rec["checks"]] == [c["spec"] for c in facts.get("checks", [])]
    for check, fact in zip(rec["checks"], facts.get("checks", []), strict=True):
        assert not mismatches(check["kwargs"], fact.get("kwargs", {})), (why, check)
        assert check["target"]["passed"] is fact["target"], (why, check)
        if "pinned_before" in fact:
            assert check["pinned_before"]["passed"] is fact["pinned_before"], (why, check)
        else:
            assert "pinned_before" not in check, (why, check)
        got = check["target"]["result"]
        assert not mismatches(got, fact.get("result", {}), fact.get("contains")), (why, got)


# -- the forward-ported series ----------------------------------------------------------


def test_port_has_pins_and_carries_every_unabsorbed_fix():
    """The same names as the source series, in its order, less the absorbed
    ones (patches/<tag>/rebase.json) and those carried in another shape or
    dropped (`ported_as` in port.toml's report), and the patches of this line
    only (`new` in port.toml)."""
    assert (PORT / "pins.toml").exists()
    status = COMMITTED["patches"]
    assert list(status) == SOURCE
    reshaped = {
        n: FACTS["report"][n]["ported_as"] for n in SOURCE if "ported_as" in FACTS["report"][n]
    }
    assert [n for n in PORTED if n not in NEW] == carried_by_name(FACTS, status)
    # a patch carried in another shape names the line's own patches that carry it
    assert all(set(names) <= set(NEW) for names in reshaped.values()), reshaped
    assert not set(NEW) & set(SOURCE), NEW  # a patch of the source line is carried
    assert PORTED  # a line with nothing to carry would be the pristine tag


def test_port_applies_exactly_and_refreshes_to_itself(tmp_path):
    """Like python -m tpfix.maint.series --line TAG check."""
    copy = tmp_path / "patches"
    shutil.copytree(PORT, copy)
    tree = pristine_tree(tmp_path / "vllm", TAG)
    q = Quilt(tree, copy)
    for name in PORTED:
        q.push_exact(name, tag=TAG)  # --fuzz=0, no offset
        q.refresh(name)  # the canonical options, quilt.REFRESH_ARGS
        assert filecmp.cmp(PORT / name, copy / name, shallow=False), name


@pytest.mark.parametrize("name", PORTED)
def test_port_keeps_its_fix(name):
    """Each port fixes what the source line's patch fixes: the same `Bug:`
    (its upstream issue), the same scenarios (test_port_scenario_... runs
    them), its Claims; what each port keeps is in port.toml."""
    port, source = read_patch(PORT / name).header, read_patch(origin(name) / name).header
    assert port.get("Bug") == source.get("Bug"), name
    assert port.get_all("Issue") == source.get_all("Issue"), name
    assert fixes(PORT / name) == FIXES[name], name
    # a hardening patch fixes no issue; it says which it relates to
    assert FIXES[name] or port.get_all("Related"), name
    assert patch_checks(PORT / name) and [c.spec for c in patch_checks(PORT / name)] == (
        scenarios(name)
    )
    assert port.get_all("Claim"), f"{name}: no Claim: fields"
    if not FIXES[name]:  # hardening: its title says no [Bugfix]
        assert "Bugfix" not in port.mail_field("Subject"), name
    _check_port_facts(name, FACTS["port"][name])


def _check_port_facts(name: str, facts: dict) -> None:
    """What port.toml says the port keeps: what its pull request fixes, the
    lines its diff adds and removes, upstream's code no port removes, what
    the ported tree holds (or lacks) and in which order, its multi-GPU
    tests, and scenarios green on trees of the tag."""
    why = f"{name}: {facts['why']}"
    assert FIXES[name] == facts["fixes"], (why, FIXES[name])
    for sign, part in (("+", "adds"), ("-", "removes")):
        for path, texts in facts.get(part, {}).items():
            lines = [x[1:] for x in _diff_of(PORT / name, path) if x.startswith(sign)]
            for text in texts:
                assert any(text in x for x in lines), (why, part, path, text)
    for text in facts.get("kept_upstream", []):
        for other in PORTED:
            diff = split((PORT / other).read_text())[1].splitlines()
            removed = [x for x in diff if x.startswith("-") and not x.startswith("---")]
            assert not any(text in x for x in removed), (why, other, text)
    for path, texts in facts.get("tree_lacks", {}).items():
        content = (port_tree(name) / path).read_text()
        assert not any(x in content for x in texts), (why, path, texts)
    for path, texts in facts.get("tree_order", {}).items():
        content = (port_tree(name) / path).read_text()
        region = content[content.index(texts[0]) :]
        at = [region.index(x) for x in texts]
        assert at == sorted(at), (why, path, texts)
    tests = multi_gpu_tests(PORT / name)
    for test in facts.get("multi_gpu_tests", []):
        assert any(test in t for t in tests), (why, test, tests)
    for green in facts.get("green", []):
        trees = [port_tree("") if t == "pristine" else port_tree(name) for t in green["on"]]
        runs = [lambda t=t, s=green["spec"]: run_scenario(t, s) for t in trees]
        for res in both(*runs) if len(runs) == 2 else [r() for r in runs]:
            assert "error" not in res, (why, res)
            assert not mismatches(res, green.get("result", {})), (why, res)


# -- red on the pristine tag (or the ports before), green with the port ----------------


@pytest.mark.parametrize("name", PORTED)
def test_port_scenario_red_before_green_with_it(name):
    """Each `Scenario:` of the port's header, with its verdict (check_*):
    red on TAG + the ports before it, green with it."""
    checks = patch_checks(PORT / name)
    assert [c.spec for c in checks] == scenarios(name)  # the same as on the source line
    for check in checks:
        before, after = both(
            lambda c=check: run_check(port_before(name), c),
            lambda c=check: run_check(port_tree(name), c),
        )
        assert before["passed"] is False, (check.spec, before)
        assert after["passed"] is True, (check.spec, after)
        if detail := FACTS["port"][name].get("red_green", {}).get(check.spec):
            got = before["result"], after["result"]
            assert not mismatches(got[0], detail.get("before", {}), detail.get("before_contains"))
            assert not mismatches(got[1], detail.get("after", {}), detail.get("after_contains"))


def _changed_tests(patchfile: Path) -> set[str]:
    """Test functions whose lines the patch adds or changes in vLLM's tests/."""
    changed: set[str] = set()
    current = func = None
    for line in split(patchfile.read_text())[1].splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].split("/", 1)[-1]
            current = path if re.match(r"tests/(.*/)?test_[^/]+\.py$", path) else None
        elif current is None or line.startswith("--- "):
            continue
        elif line.startswith("@@"):
            m = re.search(r"@@ (?:async )?def (\w+)", line)
            func = m.group(1) if m else None
        elif line[:1] in ("+", "-", " "):
            if m := re.match(r"(?:async )?def (\w+)", line[1:]):
                func = m.group(1)
            if line[0] != " " and func and func.startswith("test_"):
                changed.add(func)
    return changed


def _outcomes(out: str) -> dict[str, set[str]]:
    """{test function: outcomes} from pytest's -rA summary."""
    res: dict[str, set[str]] = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", out, re.M):
        func = re.sub(r"\[.*$", "", m.group(2).split("::")[-1])
        res.setdefault(func, set()).add(m.group(1))
    return res


def _skipped_for_gpus(out: str, test: str, tree: Path) -> bool:
    """`file::function` skipped with "Need at least 2 GPUs" (pytest names a
    skipped test by the line of its decorator or def)."""
    path, func = test.split("::")
    lines = (tree / path).read_text().splitlines()
    at = next(i for i, x in enumerate(lines, 1) if re.match(rf"(?:async )?def {func}\(", x))
    for m in re.finditer(rf"^SKIPPED \[\d+\] {re.escape(path)}:(\d+): (.*)$", out, re.M):
        start = at
        while start > 1 and lines[start - 2].startswith("@"):
            start -= 1
        if start <= int(m.group(1)) <= at and m.group(2).startswith(GPU_SKIP):
            return True
    return False


@pytest.mark.parametrize("name", [n for n in PORTED if vllm_tests(PORT / n)])
def test_ported_vllm_tests_red_then_green(name, tmp_path):
    """The vLLM tests a port adds or changes pass with it and fail without it
    (the same test files copied into the tree before it); a test it marks for
    several GPUs (@multi_gpu_only, @multi_gpu_test: upstream's multi-GPU CI
    runs it, e.g. the sizing port's end-to-end cold-then-warm start at TP2)
    skips in both for want of GPUs.  Upstream tests not marked
    skip_global_cleanup would end with a teardown error of vLLM's conftest on
    a host without an accelerator (validation.CPU_TEARDOWN): told apart from
    failures."""
    files = vllm_tests(PORT / name)
    gpu = multi_gpu_tests(PORT / name)
    changed = _changed_tests(PORT / name) - {t.split("::")[1] for t in gpu}
    assert changed, name
    red_tree = with_files(port_before(name), port_tree(name), files, tmp_path / "v")
    green, red = both(
        lambda: run_vllm_tests(port_tree(name), files, "-q", "-rA"),
        lambda: run_vllm_tests(red_tree, files, "-q", "-rA"),
    )
    summary = pytest_outcome(green.stdout)
    assert summary["green"], green.stdout[-6000:]
    assert {r.split(" (")[0] for r in summary["skip_reasons"]} <= {
        f"{GPU_SKIP} to run the test.",
        GPU_SKIP,
        "aiter is not found",
        "Only test on CUDA",
    }, summary
    outcomes = _outcomes(green.stdout)
    for func in sorted(changed):  # an ERROR here is a CPU teardown one (summary: green)
        assert outcomes.get(func, set()) - {"ERROR"} == {"PASSED"}, (func, green.stdout[-6000:])
    for test in gpu:
        assert _skipped_for_gpus(green.stdout, test, port_tree(name)), green.stdout[-6000:]
        assert _skipped_for_gpus(red.stdout, test, red_tree), red.stdout[-6000:]
    assert pytest_outcome(red.stdout)["red"], red.stdout[-6000:]
    outcomes = _outcomes(red.stdout)
    collection_error = re.search(r"^ERROR \S+\.py( |$)", red.stdout, re.M)
    reds = {f for f in changed if outcomes.get(f, set()) & {"FAILED", "ERROR"}}
    assert reds == changed or collection_error, (changed - reds, red.stdout[-6000:])
