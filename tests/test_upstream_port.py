# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The newest release line, the forward port that goes upstream: rebase
report, forward port, export.  The line is taken from the data: the newest
folder of patches/ (tpfix.lines.line_names()), its source line the `from` of
its rebase.json (what python -m tpfix.maint.start_line wrote), so a line
started with start_line (and ported) is covered with no edit here.

* scripts/tpfix/maint/rebase.py classifies every patch of the source line's
  series on the newest tag (the report is produced here, as in CI); each
  patch's class must be the committed patches/<tag>/rebase.json's, each is
  checked by the scenarios its header names, and the classification
  machinery is checked on small synthetic trees;
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
  the `Claim:` fields.

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
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tpfix.lines import get_line, line_names, newest_line, read_pin_file
from tpfix.maint.commits import git, pristine_repo
from tpfix.maint.export import export
from tpfix.maint.port_facts import fixes, mismatches
from tpfix.maint.port_facts import load as load_facts
from tpfix.maint.pr_text import _why_red
from tpfix.maint.rebase import Trees, classify, format_table, rebase
from tpfix.maint.validation import multi_gpu_tests, pytest_outcome, vllm_tests, with_files
from tpfix.patch import cached_tree, pristine_tree
from tpfix.patch_format import read_patch, read_series, split
from tpfix.quilt import Quilt
from tpfix.replay.harness import Check, patch_checks, run_check, run_scenario, run_vllm_tests

# downloads and patches the newest release, rebases, exports, replays its scenarios
pytestmark = pytest.mark.slow

if len(line_names()) < 2:
    pytest.skip(
        "no release line besides the default: nothing forward-ported", allow_module_level=True
    )
TAG = newest_line()  # the newest line: what goes upstream (maint.export's default)
PORT = get_line(TAG).patches
SERIES = PORT / "series"
# the committed classification (python -m tpfix.maint.start_line writes it)
COMMITTED = json.loads((PORT / "rebase.json").read_text())
FROM = COMMITTED["from"]  # the source line, the one whose series moved to TAG
PATCHES = get_line(FROM).patches
SOURCE = read_series(get_line(FROM).series)
PORTED = read_series(SERIES)
GPU_SKIP = "Need at least 2 GPUs"
SIGNOFF = "Export Tester <export-tester@users.noreply.github.com>"


def _origin(name: str) -> Path:
    """The folder of the patch a port comes from: the source line's, or for a
    patch of this line only (`new` in port.toml), this line's."""
    return PORT if FACTS["port"].get(name, {}).get("new") else PATCHES


def _scenarios(name: str) -> list[str]:
    """module:function of each `Scenario:` field of the patch NAME comes from."""
    header = read_patch(_origin(name) / name).header
    return [v.split()[0].split("(")[0] for v in header.get_all("Scenario")]


FACTS = load_facts(get_line(TAG))  # patches/<tag>/port.toml
NEW = [n for n in PORTED if FACTS["port"][n].get("new")]  # this line's own patches
# what each port's pull request fixes, from the header of the patch it comes from
FIXES = {n: fixes(_origin(n) / n) for n in PORTED}


def both(first, second):
    """Run two independent subprocess-bound calls side by side (2 cores)."""
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(first), pool.submit(second)
        return a.result(), b.result()


def port_tree(upto: str | None = None) -> Path:
    return cached_tree(get_line(TAG), upto)


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
def test_each_patch_is_classified_by_its_scenarios(report, name):
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
        assert [c["spec"] for c in rec["checks"]] == _scenarios(name)
    for check in rec["checks"]:
        if not check["target"]["passed"]:
            assert "pinned_before" not in check, check
    if rec["status"] == "absorbed":
        assert rec["how"] in ("reverse-applies", "checks"), rec
        if rec["how"] == "checks":
            assert rec["checks"] and all(map(_discriminates, rec["checks"])), rec
        pinned = read_pin_file(PORT / "pins.toml").get("flashinfer")
        for check in rec["checks"]:  # a scenario that reports its FlashInfer: the pinned one
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


# -- the classification machinery, on synthetic trees --------------------------------


def _lines(changes: dict[int, str] | None = None, n: int = 40) -> str:
    changes = changes or {}
    return "".join(changes.get(i, f"line {i}") + "\n" for i in range(1, n + 1))


def _diff(before: str, after: str, path: str = "m.py") -> str:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.write_text(before)
        b.write_text(after)
        proc = subprocess.run(
            ["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}", str(a), str(b)],
            capture_output=True,
            text=True,
        )
    return proc.stdout


def _case(tmp_path: Path, target_text: str, checks=(), runner=None) -> dict:
    """Patch: lines 10 and 16 of a 40-line file change; classify it on a
    target whose m.py is `target_text`."""
    before, after = _lines(), _lines({10: "line 10 fixed", 16: "line 16 fixed"})
    for name, text in (("before", before), ("after", after), ("target", target_text)):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "m.py").write_text(text)
    patchfile = tmp_path / "0001-fix.patch"
    patchfile.write_text(
        "From: A <a@example.invalid>\nSubject: fix\n\nWhy.\n---\n" + _diff(before, after)
    )
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "series").write_text("")
    q = Quilt(tmp_path / "target", tmp_path / "out")
    origin = Trees(tmp_path / "before", tmp_path / "after")
    rec = classify("0001-fix.patch", patchfile, q, origin, list(checks), runner)
    rec["_result"] = (tmp_path / "target" / "m.py").read_text()
    rec["_expected"] = after
    rec["_carried"] = read_series(tmp_path / "out" / "series")
    return rec


def test_classify_applies(tmp_path):
    rec = _case(tmp_path, _lines())
    assert rec["status"] == "applies"
    assert rec["_result"] == rec["_expected"] and rec["_carried"] == ["0001-fix.patch"]


def test_classify_offset_is_refreshed(tmp_path):
    rec = _case(tmp_path, "new 1\nnew 2\n" + _lines())
    assert (rec["status"], rec["how"]) == ("applies-with-changes", "offset/fuzz")
    assert "offset 2 lines" in rec["changes"][0]
    refreshed = (tmp_path / "out" / "0001-fix.patch").read_text()
    assert refreshed.startswith("From: A <a@example.invalid>\nSubject: fix\n\nWhy.\n")
    assert "@@ -9,13 +9,13 @@" in refreshed  # was -7,13: refreshed by quilt


def test_classify_three_way_merge(tmp_path):
    # line 13 sits inside the patch's only hunk (lines 7-19), apart from 10/16
    rec = _case(tmp_path, _lines({13: "line 13 upstream"}))
    assert (rec["status"], rec["how"]) == ("applies-with-changes", "3-way merge")
    assert rec["hunks_before_merge"][0]["hunk"] == 1
    assert rec["_result"] == _lines(
        {10: "line 10 fixed", 13: "line 13 upstream", 16: "line 16 fixed"}
    )
    refreshed = (tmp_path / "out" / "0001-fix.patch").read_text()
    assert refreshed.startswith("From: A <a@example.invalid>\nSubject: fix\n")
    assert "+line 10 fixed" in refreshed and " line 13 upstream" in refreshed


def test_classify_conflict_lists_hunks(tmp_path):
    rec = _case(tmp_path, _lines({10: "line 10 changed upstream"}))
    assert rec["status"] == "conflicts"
    (h,) = rec["hunks"]
    assert (h["file"], h["hunk"], h["line"]) == ("m.py", 1, 7)
    assert rec["merge_conflicts"] == {"m.py": 1}
    assert rec["_result"] == _lines({10: "line 10 changed upstream"})  # untouched
    assert rec["_carried"] == []


def test_classify_absorbed_reverse_applies(tmp_path):
    rec = _case(tmp_path, _lines({10: "line 10 fixed", 16: "line 16 fixed"}))
    assert (rec["status"], rec["how"]) == ("absorbed", "reverse-applies")


def test_classify_absorbed_needs_a_discriminating_check(tmp_path):
    check = Check("x:y", "fixed", lambda r: r["ok"])
    upstream_fixed_elsewhere = _lines({10: "line 10 changed upstream"})

    def red_before(tree, c):
        return {"passed": tree.name != "before"}

    rec = _case(tmp_path / "a", upstream_fixed_elsewhere, [check], red_before)
    assert (rec["status"], rec["how"]) == ("absorbed", "checks")

    def always_green(tree, c):  # passes on the old tree too: proves nothing
        return {"passed": True}

    rec = _case(tmp_path / "b", upstream_fixed_elsewhere, [check], always_green)
    assert rec["status"] == "conflicts"


# -- the forward-ported series ----------------------------------------------------------


def test_port_has_pins_and_carries_every_unabsorbed_fix():
    """The same names as the source series, in its order, less the absorbed
    ones (patches/<tag>/rebase.json), and the patches of this line only
    (`new` in port.toml)."""
    assert (PORT / "pins.toml").exists()
    status = COMMITTED["patches"]
    assert list(status) == SOURCE
    carried = [n for n in SOURCE if status[n] != "absorbed"]
    assert [n for n in PORTED if n not in NEW] == carried
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
    port, source = read_patch(PORT / name).header, read_patch(_origin(name) / name).header
    assert port.get("Bug") == source.get("Bug"), name
    assert port.get_all("Issue") == source.get_all("Issue"), name
    assert fixes(PORT / name) == FIXES[name], name
    # a hardening patch fixes no issue; it says which it relates to
    assert FIXES[name] or port.get_all("Related"), name
    assert patch_checks(PORT / name) and [c.spec for c in patch_checks(PORT / name)] == (
        _scenarios(name)
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
    assert [c.spec for c in checks] == _scenarios(name)  # the same as on the source line
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


# -- export -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("export") / TAG
    return out, export(TAG, out, SIGNOFF, run_tests=False)


def test_export_gives_one_mail_and_one_description_per_port(exported):
    out, rep = exported
    assert [p["name"] for p in rep["patches"]] == PORTED
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
    issues = sorted({f for fixes in FIXES.values() for f in fixes if f.startswith("issue-")})
    assert len(printed) == 2 * len(PORTED) + len(issues)
    assert [Path(p).suffix for p in printed] == [".patch", ".md"] * len(PORTED) + [".md"] * len(
        issues
    )
    assert [Path(p).stem for p in printed[2 * len(PORTED) :]] == issues
    assert all(Path(p).is_file() and Path(p).parent == out for p in printed)


def test_exported_mails_apply_with_git_am(exported, tmp_path):
    out, rep = exported
    mails = [out / p["mail"] for p in rep["patches"]]
    assert len(mails) == len(PORTED)
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
    issues = sorted({f for fixes in FIXES.values() for f in fixes if f.startswith("issue-")})
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
    from tpfix.util import Fail

    out = tmp_path / "export"
    rep = export(TAG, out, SIGNOFF, run_tests=False, numbers={"fusion-workspace-crash": 54321})
    first = (out / rep["patches"][0]["pr"]).read_text()
    assert "Fixes #54321." in first and "file it first" not in first
    steps = (out / "SUBMIT.md").read_text()
    assert "issue-lost-fusion.md" in steps and "issue-fusion-workspace-crash" not in steps
    assert "Duplicate" not in first and "/pr-checklist" in steps
    assert "#54321" in rep["patches"][0]["fixes"]
    others = [(out / p["pr"]).read_text() for p in rep["patches"][1:]]
    assert not any("#54321" in t for t in others)
    with pytest.raises(Fail, match="no Issue: nonsuch"):
        export(TAG, tmp_path / "x", SIGNOFF, run_tests=False, numbers={"nonsuch": 1})


def test_export_refuses_a_placeholder_signoff(tmp_path, monkeypatch):
    """The export refuses to sign off mails with a placeholder (an .invalid
    address, as the headers have) or with no identity at all (no --signoff,
    no git identity), which vLLM's DCO check rejects, and writes nothing."""
    import tpfix.maint.export as export_module
    from tpfix.util import Fail

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
