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

What a rebase showed beyond the data (which files conflict and why, key
lines of each port) is kept per tag in REPORT_FACTS / PORT_FACTS below and
checked for the line it names when that line is the newest.  Patches are
named by the series files and told apart by the scenario their header names
(the fix they show), not by file name.
"""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tpfix.lines import get_line, line_names, newest_line, read_pin_file
from tpfix.maint.export import (
    _why_red,
    export,
    git,
    multi_gpu_tests,
    pristine_repo,
    pytest_outcome,
    vllm_tests,
    with_files,
)
from tpfix.maint.rebase import Trees, classify, format_table, rebase
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
SEED_A = (
    "token_num (8192) * hidden_dim (2560) exceeds workspace max_token_num "
    "(8192) * hidden_dim (2048)"
)
INSUFFICIENT = "The buffer size in the given workspace is insufficient"
ARF = "vllm/compilation/passes/fusion/allreduce_rms_fusion.py"
FI_AR = "vllm/distributed/device_communicators/flashinfer_all_reduce.py"
CUDA_COMM = "vllm/distributed/device_communicators/cuda_communicator.py"
WORKER = "vllm/v1/worker/gpu_worker.py"
CONFIG = "vllm/config/vllm.py"
WS_TEST = "tests/compile/passes/distributed/test_fusion_all_reduce_workspace.py"
GPU_SKIP = "Need at least 2 GPUs"
SIGNOFF = "Export Tester <export-tester@users.noreply.github.com>"


def _scenarios(name: str) -> list[str]:
    """module:function of each `Scenario:` field of patches/NAME."""
    header = read_patch(PATCHES / name).header
    return [v.split()[0].split("(")[0] for v in header.get_all("Scenario")]


def _named(spec: str) -> str | None:
    """The patch of the source series whose header names scenario `spec`
    (None when none does)."""
    names = [n for n in SOURCE if spec in _scenarios(n)]
    assert len(names) <= 1, (spec, names)
    return names[0] if names else None


# The fixes the facts of the v0.33.0 rebase name (REPORT_FACTS, PORT_FACTS),
# by the scenario each shows: None where the source series has no such patch.
SIZING = _named("bug_a:warm_start")  # bug A: created at load, lives with the TP group
AGREEMENT = _named("bug_a:creation_failure")  # bug A: all ranks agree on creation
RANGES = _named("bug_a:fused_ranges")  # each model keeps its fused range
STANDALONE = _named("bug_a:standalone")  # the standalone all-reduce asks (vllm#50932)


def _fixes(patchfile: Path) -> list[str]:
    """What the port's pull request says it fixes: #N of the vLLM issue of
    its `Bug:` field, and issue-<id> for each `Issue: <id>` (an upstream
    issue the export writes, to be filed first)."""
    header = read_patch(patchfile).header
    bug = header.get("Bug") or ""
    m = re.fullmatch(r"https://github\.com/vllm-project/vllm/issues/(\d+)", bug)
    return ([f"#{m.group(1)}"] if m else []) + [f"issue-{i}" for i in header.get_all("Issue")]


# what each port's pull request fixes, from the header of the source line's patch
FIXES = {n: _fixes(PATCHES / n) for n in PORTED}


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
    onto TAG showed beyond that is checked from REPORT_FACTS."""
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
    for spec in _scenarios(name):
        if facts := REPORT_FACTS.get(TAG, {}).get(spec):
            facts(report, rec)


def _pin_absorbed_0_33_0(report: dict, rec: dict) -> None:
    """v0.33.0 pins FlashInfer 0.7.2.post1: the bug C scenario is red on
    v0.27.1 before the pin and green on pristine v0.33.0 (on this Python <
    3.12, where the check discriminates)."""
    assert (rec["status"], rec["how"]) == ("absorbed", "checks")
    (check,) = rec["checks"]
    assert check["spec"] == "bug_c:import_flashinfer_all_reduce"
    assert check["target"]["passed"] is True
    assert check["target"]["result"]["flashinfer"] == "0.7.2.post1"
    assert check["pinned_before"]["passed"] is False


def _standalone_absorbed_0_33_0(report: dict, rec: dict) -> None:
    """v0.33.0 has vllm#50932 (the standalone all-reduce asks the workspace)
    in its own words: the backport's scenario is red on v0.27.1 before it
    and green on pristine v0.33.0."""
    assert (rec["status"], rec["how"]) == ("absorbed", "checks")
    (check,) = rec["checks"]
    assert check["spec"] == "bug_a:standalone" and check["kwargs"]["passes_first"]
    assert check["target"]["passed"] is True
    assert check["pinned_before"]["passed"] is False


def _sizing_conflicts_0_33_0(report: dict, rec: dict) -> None:
    """The bug-A patch conflicts on its own (no earlier patch left behind):
    vllm#52193 sizes the pass's workspace with `self.workspace_hidden_dim`
    where the patch replaces the pass's own width; flashinfer_all_reduce.py's
    imports moved (the per-group `_node_count` where the patch adds
    `get_tp_group` next to `get_node_count`); v0.33.0's
    CudaCommunicator.destroy() tears down the PCIe IPC all-reduce where the
    patch releases the workspace.  The worker and test hunks merge.  Both
    checks are red on pristine v0.33.0: the warm start (the seed's
    ValueError), and the drafter's collected pass, whose __del__ v0.33.0
    still has, destroys the workspace: not absorbed."""
    assert rec["status"] == "conflicts", rec["detail"]
    assert rec["after_uncarried"] == {}
    assert set(_conflict_hunks(rec)) == {ARF, FI_AR, CUDA_COMM}
    assert set(rec["merge_conflicts"]) == {ARF, FI_AR, CUDA_COMM}
    assert "self.workspace_hidden_dim" in _upstream_side(report, rec["name"], ARF)
    assert "import _node_count" in _upstream_side(report, rec["name"], FI_AR)
    assert "fi_pcie_ipc_ar_comm" in _upstream_side(report, rec["name"], CUDA_COMM)
    for path in rec["merge_conflicts"]:  # the diff3 merges are there to resolve
        assert "<<<<<<< target tag" in _merged(report, rec["name"], path)
    warm, collected = rec["checks"]
    assert warm["spec"] == "bug_a:warm_start"
    assert warm["target"]["passed"] is False
    assert warm["target"]["result"]["error"] == "ValueError"
    assert SEED_A in warm["target"]["result"]["message"]
    assert collected["spec"] == "bug_a:drafter_pass_collected"
    result = collected["target"]["result"]
    assert collected["target"]["passed"] is False, result
    assert result["destroyed"] >= 1 and result["alive_after_gc"] is False, result
    for check in rec["checks"]:  # red on the target: no need to look back
        assert "pinned_before" not in check


def _agreement_conflicts_0_33_0(report: dict, rec: dict) -> None:
    """The v0.27.1 patch backports the failure latches that v0.33.0 already
    has (`_fi_ar_workspace_failed = True` on the target side).  v0.33.0
    attempts creation once but decides per rank: with a peer's creation
    failing, this rank keeps its workspace (red)."""
    assert rec["status"] == "conflicts", rec["detail"]
    assert list(rec["after_uncarried"]) == [SIZING]
    assert set(rec["merge_conflicts"]) == {WS_TEST, FI_AR}
    upstream = _upstream_side(report, rec["name"], FI_AR)
    assert "_fi_ar_workspace_failed = True" in upstream
    assert "_fi_ar_quant_workspace_failed = True" in upstream
    (check,) = rec["checks"]
    assert (check["spec"], check["kwargs"]) == ("bug_a:creation_failure", {"where": "peer"})
    result = check["target"]["result"]
    assert check["target"]["passed"] is False, result
    for start in ("cold", "warm"):
        assert result[start]["attempts"] == 1, result  # upstream's latch
        assert result[start]["workspace"] != result[start]["peer_workspace"], result


def _ranges_conflicts_0_33_0(report: dict, rec: dict) -> None:
    """The v0.27.1 patch adds the width helper that v0.33.0 has from
    vllm#52193 (`_fused_ar_workspace_hidden_dim`, widest for every config
    with a draft): that conflicts; the rest builds on the three bug A
    patch and the agreement.  With an EAGLE-3 head wider than the target, pristine v0.33.0
    fuses no token for either model (red)."""
    assert rec["status"] == "conflicts", rec["detail"]
    assert list(rec["after_uncarried"]) == [SIZING, AGREEMENT]
    assert set(rec["merge_conflicts"]) == {WS_TEST, ARF}
    assert "def _fused_ar_workspace_hidden_dim(" in _upstream_side(report, rec["name"], ARF)
    (check,) = rec["checks"]
    assert (check["spec"], check["kwargs"]) == ("bug_a:fused_ranges", {"spec_method": "eagle3"})
    result = check["target"]["result"]
    assert check["target"]["passed"] is False, result
    assert {m["fused_up_to"] for m in result["models"].values()} == {0}, result


# What the rebase onto a tag showed beyond its rebase.json (why each patch
# conflicts, what its checks gave), per patch by the scenario its header names:
# {tag: {scenario: check(report, record)}}, checked when the tag is the newest.
REPORT_FACTS: dict[str, dict[str, Callable[[dict, dict], None]]] = {
    "v0.33.0": {
        "bug_c:import_flashinfer_all_reduce": _pin_absorbed_0_33_0,
        "bug_a:standalone": _standalone_absorbed_0_33_0,
        "bug_a:warm_start": _sizing_conflicts_0_33_0,  # and bug_a:drafter_pass_collected
        "bug_a:creation_failure": _agreement_conflicts_0_33_0,
        "bug_a:fused_ranges": _ranges_conflicts_0_33_0,
    },
}


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
    ones (patches/<tag>/rebase.json)."""
    assert (PORT / "pins.toml").exists()
    status = COMMITTED["patches"]
    assert list(status) == SOURCE
    carried = [n for n in SOURCE if status[n] != "absorbed"]
    assert carried == PORTED
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
    them), its Claims; the key lines of each port of TAG are in PORT_FACTS."""
    port, source = read_patch(PORT / name).header, read_patch(PATCHES / name).header
    assert port.get("Bug") == source.get("Bug"), name
    assert port.get_all("Issue") == source.get_all("Issue"), name
    assert _fixes(PORT / name) == FIXES[name], name
    # a hardening patch fixes no issue; it says which it relates to
    assert FIXES[name] or port.get_all("Related"), name
    assert patch_checks(PORT / name) and [c.spec for c in patch_checks(PORT / name)] == (
        _scenarios(name)
    )
    assert port.get_all("Claim"), f"{name}: no Claim: fields"
    for spec in _scenarios(name):
        if facts := PORT_FACTS.get(TAG, {}).get(spec):
            facts(name)


def _sizing_port_0_33_0(name: str) -> None:
    """Only what v0.33.0 lacks, on top of vllm#52193: its width helper and
    its tests stay (in every port); one shape helper that the pass shares;
    the GPU worker creates the workspace once the model runner has loaded
    the models (warm starts: no fusion pass; no creation in CUDA graph
    capture).  vllm#52193 fixed the cold start with a wider draft upstream;
    the port keeps it fixed.  The pass no longer frees the workspace, the TP
    group's teardown does; a smaller workspace an earlier engine left is
    retired at load, not destroyed, and suspend and checkpoint cover it."""
    for other in PORTED:  # upstream's helper and its tests are kept
        text = (PORT / other).read_text()
        assert "-def _fused_ar_workspace_hidden_dim(" not in text, other
        assert "-def test_fused_ar_workspace_hidden_dim" not in text, other
    sizing = {p: _diff_of(PORT / name, p) for p in (ARF, FI_AR, WORKER)}
    assert any(x.startswith("+def fi_ar_workspace_shape(") for x in sizing[FI_AR])
    assert any(x.startswith("+def init_fi_ar_fusion_workspace(") for x in sizing[FI_AR])
    assert "+            max_token_num=rows," in sizing[ARF]
    assert any("fi_ar_workspace_shape(" in x for x in sizing[ARF] if x.startswith("+"))
    lifetime = sizing[ARF] + _diff_of(PORT / name, CUDA_COMM)
    assert "-    def __del__(self) -> None:" in lifetime
    assert "+            destroy_fi_ar_workspace()" in lifetime
    retire = "_fi_ar_retired_workspaces.append(ws)"  # at any indentation
    assert any(x.startswith("+") and x[1:].strip() == retire for x in sizing[FI_AR])
    assert "+    workspaces = [*_fi_ar_retired_workspaces, _fi_ar_workspace]" in sizing[FI_AR]
    assert "def __del__" not in (port_tree() / ARF).read_text()
    call = "+            flashinfer_all_reduce.init_fi_ar_fusion_workspace(self.vllm_config)"
    assert call in sizing[WORKER]
    # its cold-then-warm start at TP2 is for upstream's multi-GPU CI
    assert any(
        "test_draft_wider_than_target_cold_then_warm_start" in t
        for t in multi_gpu_tests(PORT / name)
    )
    assert FIXES[name] == ["issue-fusion-workspace-crash"], FIXES
    for other in PORTED:  # not forwarded yet
        assert read_patch(PORT / other).header.get("Forwarded") == "no", other
    worker = (port_tree() / WORKER).read_text()
    load = worker[worker.index("    def load_model(") :]
    assert load.index("self.model_runner.load_model(") < load.index("init_fi_ar_fusion_workspace(")
    trees = port_tree(""), port_tree()  # the cold start: green on pristine and port
    for res in both(*(lambda t=t: run_scenario(t, "bug_a:cold_start") for t in trees)):
        assert "error" not in res, res
        ws = res["workspaces"]["_fi_ar_workspace"]
        assert (ws["max_token_num"], ws["hidden_dim"]) == (8192, 2560)


def _agreement_port_0_33_0(name: str) -> None:
    """All ranks agree on creation (a MIN all-reduce); hardening, no Fixes."""
    agreement = _diff_of(PORT / name, FI_AR)
    assert "+    dist.all_reduce(created, op=dist.ReduceOp.MIN, group=group)" in agreement
    assert FIXES[name] == [] and "Bugfix" not in read_patch(PORT / name).header.mail_field(
        "Subject"
    )


def _ranges_port_0_33_0(name: str) -> None:
    """The pass's token bound and the compile range use one width helper."""
    config = _diff_of(PORT / name, CONFIG)
    assert any(x.startswith("+") and "_fused_ar_workspace_hidden_dim(self)" in x for x in config)
    assert any("not spec.uses_draft_model()" in x for x in _diff_of(PORT / name, ARF))
    assert FIXES[name] == ["issue-lost-fusion"], FIXES


# The key lines of each port of a tag (what a reviewer of that port checked),
# per patch by the scenario its header names: {tag: {scenario: check(name)}},
# checked when the tag is the newest.
PORT_FACTS: dict[str, dict[str, Callable[[str], None]]] = {
    "v0.33.0": {
        "bug_a:warm_start": _sizing_port_0_33_0,  # and bug_a:drafter_pass_collected
        "bug_a:creation_failure": _agreement_port_0_33_0,
        "bug_a:fused_ranges": _ranges_port_0_33_0,
    },
}


# -- red on the pristine tag (or the ports before), green with the port ----------------


def _warm_start_details(before: dict, after: dict) -> None:
    assert before["result"]["error"] == "ValueError", before
    assert SEED_A in before["result"]["message"], before
    ws = after["result"]["workspaces"]["_fi_ar_workspace"]
    assert (ws["max_token_num"], ws["hidden_dim"]) == (8192, 2560), after
    assert len(after["result"]["created"]) == 1, after


def _ranges_details(before: dict, after: dict) -> None:
    """SM90 TP4, target 2048 / draft 2560: the target fused up to the
    drafter's 409 tokens (vllm#52193's widest bound); with the port up to
    its own 512."""
    assert before["result"]["models"]["target"]["fused_up_to"] == 409, before
    assert after["result"]["models"]["target"]["fused_up_to"] == 512, after
    assert after["result"]["models"]["draft"]["fused_up_to"] == 409, after


DETAILS = {"bug_a:warm_start": _warm_start_details, "bug_a:fused_ranges": _ranges_details}


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
        if check.spec in DETAILS:
            DETAILS[check.spec](before, after)


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
    a host without an accelerator (export.CPU_TEARDOWN): told apart from
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
