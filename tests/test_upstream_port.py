# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The series moved to vLLM v0.33.0: rebase report, forward port, export.

* scripts/tpfix/maint/rebase.py classifies every patch of patches/series on v0.33.0 (the
  report is produced here, as in CI, and each class is asserted), and its
  classification machinery is checked on small synthetic trees;
* lines/v0.33.0/ (the forward-ported series of the v0.33.0 line, its pins.toml) applies
  exactly to pristine v0.33.0 and refreshes to itself;
* each port is red without / green with it on v0.33.0: its scenario (the
  functions tests/test_bug_*.py use, run on v0.33.0 trees with FlashInfer
  0.7.2.post1, the release v0.33.0 pins) and the vLLM tests it carries;
* scripts/tpfix/maint/export.py's mails apply with `git am` to a git repository made from
  pristine v0.33.0 and give the ported tree; the PR descriptions follow
  v0.33.0's template.
"""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tpfix.maint.export import export, git, pristine_repo, run_pytest, vllm_tests, with_files
from tpfix.maint.rebase import Trees, classify, format_table, rebase
from tpfix.patch import cached_tree, prepare_tree
from tpfix.patchfile import read_series
from tpfix.quilt import Quilt
from tpfix.replay.harness import Check, patch_checks, run_scenario

# downloads and patches the newest release, rebases, exports, replays its scenarios
pytestmark = pytest.mark.slow

TAG = "v0.33.0"
PORT = Path(__file__).resolve().parent.parent / "lines" / TAG
SERIES = PORT / "series"
BUG_A = "0002-allreduce-fusion-size-workspace-from-engine-config.patch"
BUG_B = "0003-allreduce-fusion-one-shot-threshold-in-one-unit.patch"
BUG_C = "0001-flashinfer-0.6.16.post4-python-3.10-3.11.patch"
SEED_A = (
    "token_num (8192) * hidden_dim (2560) exceeds workspace max_token_num "
    "(8192) * hidden_dim (2048)"
)
PORTED = read_series(SERIES)


def both(first, second):
    """Run two independent subprocess-bound calls side by side (2 cores)."""
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(first), pool.submit(second)
        return a.result(), b.result()


def port_tree(upto: str | None = None) -> Path:
    return cached_tree(upto, TAG, SERIES, PORT)


def port_before(name: str) -> Path:
    i = PORTED.index(name)
    return port_tree(PORTED[i - 1] if i else "")


# -- the rebase report v0.27.1 -> v0.33.0 -------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("rebase") / TAG
    rep = rebase(TAG, out)
    assert json.loads((out / "report.json").read_text()) == rep
    rep["_out"] = out
    return rep


def _record(report: dict, name: str) -> dict:
    return next(r for r in report["patches"] if r["name"] == name)


def test_report_covers_the_series_in_order(report):
    assert [r["name"] for r in report["patches"]] == read_series()
    assert (report["from"], report["to"]) == ("v0.27.1", TAG)
    print(format_table(report))


def test_flashinfer_pin_is_absorbed_detected_by_its_scenario(report):
    """v0.33.0 pins FlashInfer 0.7.2.post1: the bug C scenario is red on
    v0.27.1 before 0001 and green on pristine v0.33.0 (on this Python < 3.12,
    where the check discriminates)."""
    rec = _record(report, BUG_C)
    assert (rec["status"], rec["how"]) == ("absorbed", "checks")
    (check,) = rec["checks"]
    assert check["spec"] == "bug_c:import_flashinfer_all_reduce"
    assert check["target"]["passed"] is True
    assert check["target"]["result"]["flashinfer"] == "0.7.2.post1"
    assert check["pinned_before"]["passed"] is False
    assert BUG_C not in report["carried"]
    assert BUG_C not in PORTED  # not carried forward


def test_bug_a_conflicts_with_upstreams_partial_fix(report):
    """v0.33.0's flashinfer_all_reduce.py moved on (per-group backend
    resolution, standalone sizing, failure latches), CudaCommunicator gained
    the PCIe IPC all-reduce and the worker's imports and load_model changed:
    the failed hunks are listed, and the warm-start check is red on pristine
    v0.33.0 (not absorbed)."""
    rec = _record(report, BUG_A)
    assert rec["status"] == "conflicts"
    fi_ar = "vllm/distributed/device_communicators/flashinfer_all_reduce.py"
    files = {h["file"] for h in rec["hunks"]}
    assert fi_ar in files
    for h in rec["hunks"]:
        assert h["hunk"] >= 1 and h["line"] >= 1 and h["header"].startswith("@@ ")
    assert fi_ar in rec["merge_conflicts"]
    assert set(rec["merge_conflicts"]) <= {
        "vllm/compilation/passes/fusion/allreduce_rms_fusion.py",
        "vllm/distributed/device_communicators/cuda_communicator.py",
        fi_ar,
        "vllm/v1/worker/gpu_worker.py",
    }
    for path in rec["merge_conflicts"]:  # the diff3 merges are there to resolve
        assert "<<<<<<< target tag" in (report["_out"] / "conflicts" / BUG_A / path).read_text()
    (check,) = rec["checks"]
    assert check["target"]["passed"] is False
    assert SEED_A in check["target"]["result"]["message"]


def test_bug_b_classification(report):
    if BUG_B not in read_series():
        pytest.skip("patch 0003 is not in patches/series yet")
    rec = _record(report, BUG_B)
    # 0003 builds on 0002 (its hunks sit next to what 0002 changes), which
    # does not apply as is: it cannot apply alone either, and it conflicts
    # only in files 0002 touches
    assert rec["status"] == "conflicts", rec
    assert BUG_A in rec["after_uncarried"], rec
    assert rec["merge_conflicts"], rec
    assert set(rec["merge_conflicts"]) <= set(rec["after_uncarried"][BUG_A]), rec
    # not absorbed: the narrower-draft case still fails as shipped in v0.33.0
    (check,) = rec["checks"]
    assert check["target"]["passed"] is False, check
    assert check["target"]["result"]["failures"] == 1, check


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


def test_port_has_pins_and_carries_only_unabsorbed_fixes():
    assert (PORT / "pins.toml").exists()
    assert PORTED and PORTED[0] == BUG_A
    assert set(PORTED) <= set(read_series()) - {BUG_C}


def test_port_applies_exactly_and_refreshes_to_itself(tmp_path):
    """Like python -m tpfix.maint.series --line v0.33.0 check."""
    copy = tmp_path / "patches"
    shutil.copytree(PORT, copy)
    tree = prepare_tree(tmp_path / "vllm", upto="", tag=TAG)
    q = Quilt(tree, copy)
    for name in PORTED:
        q.push_exact(name, tag=TAG)  # --fuzz=0, no offset
        q.refresh(name)  # the canonical options, quilt.REFRESH_ARGS
        assert filecmp.cmp(PORT / name, copy / name, shallow=False), name


def test_port_of_bug_a_keeps_upstreams_fix_and_adds_the_rest():
    """Only what v0.33.0 lacks, on top of vllm#52193: its width helper and
    its tests stay, the workspace shape is built on the helper, the worker
    creates the workspace after loading the models (warm start), creation is
    rank-agreed and latched per group, and the pass no longer frees it."""
    texts = {name: (PORT / name).read_text() for name in PORTED}
    text = texts[BUG_A]
    for t in texts.values():  # upstream's helper and its tests are kept
        assert "-def _fused_ar_workspace_hidden_dim(" not in t
        assert "-def test_fused_ar_workspace_hidden_dim" not in t
    assert "+def get_fi_ar_workspace_shape(" in text
    assert "+    hidden_dim = _fused_ar_workspace_hidden_dim(vllm_config)" in text
    # the worker creates it after loading the models (gpu_worker.py)
    assert "+            init_fi_ar_workspace(self.vllm_config, compiled)" in text
    assert "+    dist.all_reduce(created, op=dist.ReduceOp.MIN, group=group)" in text
    assert "_fi_ar_workspace_failed is group" in text
    assert "-    def __del__(self) -> None:" in text
    assert "+        destroy_fi_ar_workspace(self.cpu_group)" in text  # teardown
    assert re.search(r"^Bug: https://github.com/vllm-project/vllm/issues/52023$", text, re.M)
    assert re.search(r"^Forwarded: no$", text, re.M)
    tree = port_tree()
    pass_src = (tree / "vllm/compilation/passes/fusion/allreduce_rms_fusion.py").read_text()
    assert "def _fused_ar_workspace_hidden_dim(config: VllmConfig) -> int:" in pass_src
    assert "def __del__" not in pass_src
    test_src = (tree / "tests/compile/passes/distributed/test_fusion_all_reduce.py").read_text()
    assert "def test_fused_ar_workspace_hidden_dim(" in test_src
    assert "def test_fused_ar_workspace_hidden_dim_spec_without_draft(" in test_src


# -- red on pristine v0.33.0, green on the port ------------------------------------------


def test_bug_a_warm_start_red_on_pristine(report):
    # the rebase report ran bug_a:warm_start on pristine v0.33.0 already
    (check,) = _record(report, BUG_A)["checks"]
    assert check["spec"] == "bug_a:warm_start"
    assert check["target"]["result"]["error"] == "ValueError"
    assert SEED_A in check["target"]["result"]["message"]


def test_bug_a_warm_start_green_on_port():
    res = run_scenario(port_tree(BUG_A), "bug_a:warm_start")
    assert "error" not in res, res
    for model in ("target", "draft"):
        for n, v in res["forward"][model].items():
            assert v["fused"] and v["max_abs_err"] == 0.0, (model, n, v)
    ws = res["workspaces"]["_fi_ar_workspace"]
    assert (ws["max_token_num"], ws["hidden_dim"]) == (8192, 2560)
    assert len(res["created"]) == 1


def test_bug_a_cold_start_green_on_pristine_and_port():
    """vllm#52193 fixed the cold start upstream; the port keeps it fixed."""
    trees = port_tree(""), port_tree(BUG_A)
    for res in both(*(lambda t=t: run_scenario(t, "bug_a:cold_start") for t in trees)):
        assert "error" not in res, res
        ws = res["workspaces"]["_fi_ar_workspace"]
        assert (ws["max_token_num"], ws["hidden_dim"]) == (8192, 2560)


needs_b = pytest.mark.skipif(BUG_B not in PORTED, reason="bug B not ported yet")
INSUFFICIENT = "The buffer size in the given workspace is insufficient"


@needs_b
def test_bug_b_narrower_draft_red_before_green_on_port(report):
    """MNNVL TP8, workspace created at 6144, 4096-wide tensors: FlashInfer's
    AUTO asks one-shot for 16 tokens (1048576 bytes > 983040 reserved).
    Pristine v0.33.0 raises (the rebase report ran it), so does the ported
    0002 alone (the worker creates the 6144-wide workspace), with the port
    vLLM requests two-shot."""
    (check,) = _record(report, BUG_B)["checks"]
    pristine = check["target"]["result"]
    assert pristine["failures"] == 1, pristine
    assert INSUFFICIENT in pristine["failure_examples"][0]["error"], pristine
    (scenario,) = patch_checks(PORT / BUG_B)  # the port's Scenario: field
    case = scenario.kwargs
    before, after = both(
        lambda: run_scenario(port_before(BUG_B), "bug_b:run_case", **case),
        lambda: run_scenario(port_tree(BUG_B), "bug_b:run_case", **case),
    )
    assert "error" not in before, before
    assert (before["failures"], before["unfused"]) == (1, 0), before
    assert INSUFFICIENT in before["failure_examples"][0]["error"], before
    assert before["planned_shape"] == [16, 6144], before  # created by 0002's sizing
    assert "error" not in after, after
    assert (after["failures"], after["unfused"]) == (0, 0), after
    assert after["oneshot_tokens"]["4096"] == [[1, 15]]
    assert after["twoshot_tokens"]["4096"] == [[16, 16]]


@needs_b
def test_bug_b_seed_red_before_green_on_port():
    """The seed (GLM, hidden 6144, SM90 TP8, MNNVL): vLLM's own one-shot
    table exceeds the MNNVL allocation for N = 13..42 without the port (the
    reason vllm#47589 has to ignore it there); with it every N fits."""
    before, after = both(
        lambda: run_scenario(port_before(BUG_B), "bug_b:seed_replay"),
        lambda: run_scenario(port_tree(BUG_B), "bug_b:seed_replay"),
    )
    assert "error" not in before, before
    assert before["policy_failing_tokens"] == list(range(13, 43))
    assert "Buffer: 1179648 bytes, Required: 3932160 bytes" in before["policy_error_at_40"]
    assert "error" not in after, after
    for name, run in after["runs"].items():
        assert run["vllm_table_forced_on_mnnvl"] is False, name
        assert (run["failures"], run["unfused"]) == (0, 0), (name, run)
    assert after["runs"]["mnnvl_vllm_policy"]["mnnvl_buffer_size_bytes"] == 1179648


@pytest.mark.parametrize("name", [n for n in PORTED if vllm_tests(PORT / n)])
def test_ported_vllm_tests_red_then_green(name, tmp_path):
    """The vLLM tests a port adds or changes pass with it and fail without it
    (the same test files copied into the tree before it).  Here the multi-GPU
    ones skip, and upstream tests not marked skip_global_cleanup end with a
    teardown error of vLLM's conftest on a host without an accelerator
    (export.CPU_TEARDOWN): both are told apart from failures."""
    files = vllm_tests(PORT / name)
    red_tree = with_files(port_before(name), port_tree(name), files, tmp_path / "v")
    green, result = both(
        lambda: run_pytest(port_tree(name), files), lambda: run_pytest(red_tree, files)
    )
    assert green["green"], green
    assert set(green["skip_reasons"]) <= {
        "Need at least 2 GPUs to run the test.",
        "aiter is not found",
        "Only test on CUDA",
    }, green
    assert result["red"], result  # failures, or a collection error (names it adds)


# -- export -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("export") / TAG
    return out, export(TAG, out, run_tests=False)


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
        assert f"Subject: [PATCH {n}/{m}] [Bugfix]" in text
        assert re.search(r"^Signed-off-by: .+ <.+@.+>$", text, re.M)
        assert "Forwarded:" not in text  # distribution-only trailers stay home
        assert p["fixes"]


def test_pr_descriptions_follow_vllms_template(exported):
    out, rep = exported
    fixes = {BUG_A: "#52023", BUG_B: "#47284"}
    for p in rep["patches"]:
        text = (out / p["pr"]).read_text()
        for section in ("## Overview", "## Claims", "## Validation", "## Details"):
            assert section in text
        assert f"Fixes {fixes[p['name']]}" in text
        assert "Pull Request Checklist" in text
        assert "- [x] AI assistance was used" in text
        assert "root cause" in text.lower() or "Root cause" in text
