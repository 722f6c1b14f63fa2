# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A (seed 000, issue 3): the FlashInfer all-reduce fusion workspace that
the target and the drafter share, sized by its first creator, living with a
fusion pass and created per rank; patches 0003 (created at model load for
every model, living with the TP group), 0004 (created once, all ranks
agreeing), 0005 (each model keeps its fused range, within the budget) and,
for the standalone FlashInfer all-reduce, 0002 (vllm#50932: it asks the
workspace whether an input fits).

Every scenario runs the REAL vLLM code of the tree under test (configs, the
worker's distributed init and ``Worker.load_model``, AllReduceFusionPass, the
fused custom op, everything in flashinfer_all_reduce.py, the TP group's
``CudaCommunicator.destroy()``) and FlashInfer's real Python validation, in
a subprocess.  SIMULATED (see scripts/tpfix/replay/device.py): the CUDA device
(platform reports CUDA, static graph support and the SM capability),
torch.distributed (a fake TP group whose all-reduce is input * TP, a real
CudaCommunicator made with __new__ without NCCL/custom all-reduce, one peer
rank standing for the others), the model runner (loads nothing; its model
is a stand-in marked as @support_torch_compile marks a compiled model), GPU
allocation (FlashInfer's real workspace classes built with cls.__new__,
sized with FlashInfer's own formulas, refused while a CUDA graph is
captured), CUDA graph capture (a flag), the kernels (CPU reference kernels
behind FlashInfer's launch code) and the torch.ops._C ops vLLM looks up at
import (vllm_cpu_stubs).

Each scenario is assigned to the patch that fixes it and runs on
tree_before(patch) (red) and tree_after(patch) (green); the verdicts of the
patch headers' ``Scenario:`` fields (replay.harness) are applied to the same
results.

The line: these red/green facts (which case each patch fixes, the shapes,
the attempts) are those of the line the bug-A patches were written on,
v0.27.1, whatever the top-level VERSION names: a line started from it
(rebase.json) replays each port's scenarios against its own tag from its
port.toml (test_upstream_port.py), and every line's prefixes run this
suite in test_bisect.py.

Tiers: the seed's cold and warm start and each patch header's ``Scenario:``
(each red before and green after its patch) are the fast tier; the suite of
named cases on every tree of the series runs the same code over many more
configurations and is marked slow, as is the property test over the
configuration space (test_bug_a_property.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from replays import source_line, suites

from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.replay import bug_a
from tpfix.replay.harness import patch_checks, run_scenario, tree_after, tree_before

LINE = source_line(get_line())  # v0.27.1, for the default line and its ports
PATCHES = LINE.patches
SERIES = read_series(LINE.series)


def _patch(number: str) -> str:
    (name,) = (n for n in SERIES if n.startswith(number + "-"))
    return name


STANDALONE, SIZING, AGREEMENT, RANGES = (_patch(n) for n in ("0002", "0003", "0004", "0005"))
WHEN = {
    "before": lambda patch: tree_before(patch, LINE),
    "after": lambda patch: tree_after(patch, LINE),
}
SEED_MESSAGE = bug_a.SEED_MESSAGE
MiB = 2**20

# The cases of bug_a.suite() that each bug-A patch header's Scenario: fields
# name, in their order.
HEADER_CASES = {
    STANDALONE: ["standalone_small_budget"],
    SIZING: ["warm_seed", "drafter_collected"],
    AGREEMENT: ["fail_peer"],
    RANGES: ["fused_ranges_eagle_wider"],
}


def _suites(jobs: dict[Path, list[str] | None]) -> dict[Path, dict]:
    """bug_a:suite on each tree (its ``names``; None: all), one subprocess per
    tree, run concurrently (they are independent)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            tree: pool.submit(run_scenario, tree, "bug_a:suite", timeout=1800, names=names)
            for tree, names in jobs.items()
        }
        results = {tree: fut.result() for tree, fut in futures.items()}
    for tree, res in results.items():
        assert "error" not in res, (tree, res)
    return results


@pytest.fixture(scope="module")
def fast():
    """The seed's cold and warm start around the sizing patch and each
    header's case around its patch; case(patch, when, name) -> result."""
    wanted: dict[Path, list[str]] = {}
    cases = [(SIZING, ["cold_seed"]), *HEADER_CASES.items()]
    for patch, names in cases:
        for when in WHEN.values():
            wanted.setdefault(when(patch), []).extend(names)
    results = _suites(wanted)
    return lambda patch, when, name: results[WHEN[when](patch)][name]


@pytest.fixture(scope="module")
def suite():
    """Every named case on every tree the tests below ask for: the tree after
    each patch, and the one before each patch that fixes a case (every prefix
    but the bare tag, where bug C stops every case), shared with
    test_bisect.py (tests/replays.py)."""
    trees = {tree_after(p, LINE) for p in SERIES} | {tree_before(p, LINE) for p in FIXED_BY}
    results = suites(sorted(trees))
    return lambda patch, when, name: results[WHEN[when](patch)][name]


def _fused_everywhere_ok(res: dict, models=("target", "draft")) -> None:
    assert "error" not in res, res
    for model in models:
        sent = res["forward"][model]
        assert any(v["fused"] for v in sent.values()), (model, sent)
        for n, v in sent.items():
            if v["fused"]:
                assert v["max_abs_err"] == 0.0, (model, n, v)
    # FlashInfer got every fused call: no fallback was needed
    assert res["kernel_calls"], res


def _shape(res: dict) -> tuple[int, int]:
    ws = res["workspaces"]["_fi_ar_workspace"]
    return ws["max_token_num"], ws["hidden_dim"]


def _seed_error(res: dict) -> None:
    assert res.get("error") == "ValueError", res
    assert SEED_MESSAGE in res["message"], res["message"]


# -- the seed and the headers' scenarios: red before, green after (fast) ----------
def test_cold_start_seed_message_before(fast):
    _seed_error(fast(SIZING, "before", "cold_seed"))


def test_cold_start_after(fast):
    res = fast(SIZING, "after", "cold_seed")
    _fused_everywhere_ok(res)
    assert _shape(res) == (8192, 2560)
    # 80 MiB buffer + 240 MiB Lamport + flags (BRIEF: 64->80, 192->240 MiB)
    assert res["workspaces"]["_fi_ar_workspace"]["bytes"] == 80 * MiB + 240 * MiB + 2 * 256 * 4
    # one workspace for the whole engine, created once
    assert len(res["created"]) == 1
    # fusion applies to the drafter at the profile-run size (8192 tokens)
    assert res["forward"]["draft"]["8192"]["fused"]
    assert res["fusion_covers_budget"] == {"target": True, "draft": True}


def test_warm_start_seed_message_before(fast):
    # the warm start (AOT cache, lazy creation) dies with the seed's message too
    _seed_error(fast(SIZING, "before", "warm_seed"))


def test_warm_start_after(fast):
    # no fusion pass is built: the worker created the workspace for both models
    res = fast(SIZING, "after", "warm_seed")
    _fused_everywhere_ok(res)
    assert _shape(res) == (8192, 2560)
    assert len(res["created"]) == 1


@pytest.mark.parametrize("patch", list(HEADER_CASES))
def test_header_scenario_red_before_green_after(fast, patch):
    """Each Scenario: of each bug-A patch is the suite case run here (same
    function, same arguments), and its verdict is False on the tree before
    the patch and True on the tree with it."""
    checks = patch_checks(PATCHES / patch)
    assert len(checks) == len(HEADER_CASES[patch])
    for check, case in zip(checks, HEADER_CASES[patch]):
        fn, kwargs = bug_a.suite_cases()[case]
        assert (check.spec, check.kwargs) == (f"bug_a:{fn.__name__}", kwargs)
        before, after = (fast(patch, w, case) for w in WHEN)
        assert check.passes(before) is False, (case, before)
        assert check.passes(after) is True, (case, after)


def test_drafter_pass_collected_before_and_after(fast):
    before, after = (fast(SIZING, w, "drafter_collected") for w in WHEN)
    # before: the pass's __del__ freed it, the target's next call made another
    assert before["destroyed"] == 1 and len(before["created"]) == 2, before
    assert after["destroyed"] == 0 and after["alive_after_gc"], after
    assert len(after["created"]) == 1


def test_peer_failure_before_and_after(fast):
    before, after = (fast(AGREEMENT, w, "fail_peer") for w in WHEN)
    for start in ("cold", "warm"):
        # before: this rank fuses, the peer has no workspace
        b = before[start]
        assert (b["attempts"], b["workspace"], b["peer_workspace"]) == (1, True, False), b
        a = after[start]
        assert (a["attempts"], a["workspace"], a["peer_workspace"]) == (1, False, False), a


# -- the suite of named cases, each around the patch that fixes it (slow) -----------
# patch -> cases red (False) before it and green (True) with it, by verdict
FIXED_BY = {
    STANDALONE: ["standalone_tp4", "standalone_small_budget"],
    SIZING: [
        "cold_seed",
        "warm_seed",
        "cold_quant_fp8",
        "warm_quant_first",
        "warm_mnnvl_sm100",
        "warm_standalone_first_narrow_draft",
        "capture_first_use",
        "capture_order_seed_000",
        "capture_order_seed_000_no_warmup",
        "capture_order_seed_001_no_warmup",
        "two_engines",
        "two_engines_no_teardown",
        "drafter_collected",
    ],
    AGREEMENT: [
        "fail_local",
        "fail_peer",
        "fail_local_mnnvl",
        "fail_peer_mnnvl",
        "two_engines_first_failed",
    ],
    RANGES: ["fused_ranges_eagle_wider"],
}


def _second_engine_ok(res: dict) -> bool:
    """The second, wider engine (5120) gets a workspace of its own: SM90 TP2
    64 MiB / (5120 * 2 B) = 6553 tokens, and runs fused and exact."""
    if "error" in res:
        return False
    fused = [v for v in res["forward"]["target"].values() if v["fused"]]
    return (
        _shape(res) == (6553, 5120) and bool(fused) and all(v["max_abs_err"] == 0.0 for v in fused)
    )


def _fails(res: dict, *messages: str) -> bool:
    return "error" in res and any(m in res["message"] for m in messages)


def verdict(name: str, res: dict) -> bool | None:
    """True: the case shows the fixed behaviour; False: the bug; None: neither."""
    fn = bug_a.suite_cases()[name][0]
    if fn is bug_a.cold_start or fn is bug_a.warm_start:
        return bug_a.check_warm_start(res)
    if fn is bug_a.warm_start_capture_order:
        return bug_a.check_warm_start_capture_order(res)
    if fn is bug_a.drafter_pass_collected:
        return bug_a.check_drafter_pass_collected(res)
    if fn is bug_a.creation_failure:
        return bug_a.check_creation_failure(res)
    if fn is bug_a.capture_first_use:
        if res["attempts_in_capture"]:
            return False
        return res["call"] == {"fused": True, "max_abs_err": 0.0}
    if fn is bug_a.standalone:
        if (checked := bug_a.check_standalone(res)) is not True:
            return checked
        return len(res["kernel_calls"]) == sum(map(len, res["accepted"].values()))
    if fn is bug_a.fused_ranges:
        return bug_a.check_fused_ranges(res)
    if name == "two_engines_first_failed":
        if "error" not in res and res["first_attempts"] > 1:
            return False  # engine 1 retried a collective creation
        return _second_engine_ok(res) and not res["first_fused"]
    if fn is bug_a.two_engines:
        if _fails(res, "exceeds workspace max_token_num"):
            return False
        return _second_engine_ok(res) or None
    raise AssertionError(f"no verdict for {name}")


CASES = [(p, c) for p, cases in FIXED_BY.items() for c in cases]


@pytest.mark.slow
@pytest.mark.parametrize(("patch", "case"), CASES, ids=[f"{p[:4]}-{c}" for p, c in CASES])
def test_red_before_green_after(suite, patch, case):
    before, after = suite(patch, "before", case), suite(patch, "after", case)
    assert verdict(case, before) is False, before
    assert verdict(case, after) is True, after


@pytest.mark.slow
@pytest.mark.parametrize(("patch", "case"), CASES, ids=[f"{p[:4]}-{c}" for p, c in CASES])
def test_stays_fixed_to_the_end_of_the_series(suite, patch, case):
    later = SERIES[SERIES.index(patch) + 1 :]
    for name in later:
        assert verdict(case, suite(name, "after", case)) is True, (name, case)


def test_every_case_has_a_patch_or_is_unaffected():
    fixed = {c for cases in FIXED_BY.values() for c in cases}
    assert set(bug_a.suite_cases()) == fixed | set(UNAFFECTED) | set(NOT_A_BUG)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["fail_local", "fail_local_mnnvl"])
def test_local_failure_retried_before_the_agreement(suite, case):
    """Before the agreement patch (v0.27.1 has no failure latch) a failed
    creation is retried by the next caller (the fusion pass after the
    worker, the drafter's pass, the next op call); after it: one attempt,
    every rank without a workspace, fusion off at a cold start, every warm
    call fails clearly."""
    before, after = suite(AGREEMENT, "before", case), suite(AGREEMENT, "after", case)
    assert before["cold"]["attempts"] == before["warm"]["attempts"] == 2, before
    for start in ("cold", "warm"):
        assert after[start]["attempts"] == 1, after
        assert after[start]["workspace"] is after[start]["peer_workspace"] is False
    assert after["cold"]["fusion_enabled"] == [False, False]
    for call in after["warm"]["calls"]:
        assert call.get("error") == "AssertionError", call
        assert "must be initialized" in call["message"]


@pytest.mark.slow
def test_no_creation_during_cuda_graph_capture(suite):
    """Warm start whose first fused call is inside a CUDA graph capture: the
    workspace must exist already (created when the worker loaded the models)."""
    before, after = (suite(SIZING, w, "capture_first_use") for w in WHEN)
    assert before["attempts_in_capture"] == 1, before  # refused inside the capture
    assert before["call"]["error"] == "AssertionError", before
    assert after["attempts_in_capture"] == after["collectives_in_capture"] == 0, after
    assert after["call"] == {"fused": True, "max_abs_err": 0.0}, after


@pytest.mark.slow
def test_capture_order_seed_000(suite):
    """The start order of vLLM, seed 000: the profile run at 8192 tokens is fused
    for both models, so before 0002 the target's op creates 8192 x 2048 there
    (outside any capture) and the drafter's 8192 x 2560 fails, with or
    without warm-ups.  After: 51 capture sizes, each warmed up once, all
    fused on the worker's 8192 x 2560 workspace."""
    for case in ("capture_order_seed_000", "capture_order_seed_000_no_warmup"):
        before, after = (suite(SIZING, w, case) for w in WHEN)
        _seed_error(before)
        assert before["at"] == "profile:draft:8192", before
        assert after["attempts_in_capture"] == 0 and _shape(after) == (8192, 2560)
    after = suite(SIZING, "after", "capture_order_seed_000")
    assert after["cudagraph_mode"] == "FULL_AND_PIECEWISE", after
    assert after["num_warmups"] == after["config_num_warmups"] == 1
    assert after["capture_sizes"] == {"count": 51, "largest": 512}
    assert after["calls"] == {"fused": 2 * (1 + 2 * 51), "unfused": 0}


@pytest.mark.slow
def test_capture_order_seed_001(suite):
    """Seed 001's configuration (TP8 SM90, MNNVL, 6144, no drafter: fuses
    1..42).  The profile run (8192 tokens) and the capture sizes 256..48 run
    unfused; the first fused call is at 40 tokens.  vLLM runs one eager
    warm-up before each capture (VllmConfig sets cudagraph_num_of_warmups = 1
    on a platform with static graph support; the CompilationConfig default
    is 0): that warm-up creates the workspace outside the capture, and
    pristine v0.27.1 starts.  Only without warm-ups is the first fused call
    inside a capture, where creation is refused: pristine fails ("must be
    initialized"), 0002 created the workspace at load."""
    for when in WHEN:
        res = suite(SIZING, when, "capture_order_seed_001")
        assert bug_a.check_warm_start_capture_order(res) is True, res
        assert res["config_num_warmups"] == 1 and res["first_fused"] == "warmup:target:40"
        assert res["fused_ranges"] == {"target": [[1, 42]]}
    before, after = (suite(SIZING, w, "capture_order_seed_001_no_warmup") for w in WHEN)
    assert before["error"] == "AssertionError" and before["at"] == "capture:target:40", before
    assert "workspace must be initialized" in before["message"]
    assert after["first_fused"] == "capture:target:40" and after["attempts_in_capture"] == 0


@pytest.mark.slow
def test_standalone_asks_the_workspace(suite):
    """FlashInferAllReduce (SM90 TP4, 2 MiB), constructed before the models
    are loaded, bounds tokens by its budget at its first input's width (512
    of 2048).  Pristine: it creates the workspace for that input (512 x 2048)
    and the drafter's 410 x 2560 fails.  With 0002 (vllm#50932) it asks the
    workspace; from the sizing patch on the worker creates it at load for
    both models (512 x 2048 elements in rows of 2560: 410 x 2560), which
    holds the drafter's 410 tokens too."""
    before, after = (suite(STANDALONE, w, "standalone_tp4") for w in WHEN)
    assert "token_num (410) * hidden_dim (2560) exceeds" in before["message"], before
    assert "error" not in after and max(after["accepted"]["draft"]) == 409, after
    last = suite(SERIES[-1], "after", "standalone_tp4")
    assert _shape(last) == (410, 2560) and last["created_at_load"] == 1
    assert max(last["accepted"]["target"]) == 512
    assert max(last["accepted"]["draft"]) == 410
    # a fusion budget below the standalone all-reduce's (1 of 64 MiB), cold:
    # the pass's 256 x 2048 workspace; pristine accepts 257 tokens and fails
    before, after = (suite(STANDALONE, w, "standalone_small_budget") for w in WHEN)
    assert "token_num (257) * hidden_dim (2048) exceeds" in before["message"], before
    assert max(after["accepted"]["target"]) == 256, after


@pytest.mark.slow
@pytest.mark.parametrize("case", ["two_engines", "two_engines_no_teardown"])
def test_second_wider_engine(suite, case):
    """Before the sizing patch the second, wider engine finds the first
    engine's 8192 x 2048 workspace (pristine's teardown leaves it).  From it,
    the TP group's teardown releases that workspace (two_engines); where the
    groups are kept, the worker retires it (its graphs may still run: not
    destroyed) and creates one for the new engine."""
    before = suite(SIZING, "before", case)
    assert "token_num (6553) * hidden_dim (5120) exceeds" in before["message"], before
    for patch in SERIES[SERIES.index(SIZING) :]:
        after = suite(patch, "after", case)
        assert _second_engine_ok(after), (patch, after)
        assert after["destroyed_at_teardown"] == (1 if case == "two_engines" else 0), after
        assert after["created"] == [
            {"backend": "trtllm", "max_token_num": 6553, "hidden_dim": 5120, "bytes": 536823808}
        ]


@pytest.mark.slow
def test_first_engine_failed_creation(suite):
    """Engine 1's creation fails on this rank: before the agreement patch the
    pass tries again after the worker (a second collective creation); with
    it engine 1 runs unfused after one attempt, and the teardown resets the
    latch for engine 2."""
    before, after = (suite(AGREEMENT, w, "two_engines_first_failed") for w in WHEN)
    assert (before["first_attempts"], before["first_fused"]) == (2, True), before
    assert (after["first_attempts"], after["first_fused"]) == (1, False), after
    assert after["destroyed_at_teardown"] == 0 and _second_engine_ok(after)


# -- correct in every tree ------------------------------------------------------
UNAFFECTED = {
    # case: (models, workspace shape)
    "cold_narrow_draft": (("target", "draft"), (8192, 4096)),
    "warm_narrow_draft": (("target", "draft"), (8192, 4096)),
    "cold_equal": (("target", "draft"), (8192, 2048)),
    "warm_equal": (("target", "draft"), (8192, 2048)),
    "cold_no_spec": (("target",), (8192, 2048)),
    "warm_no_spec": (("target",), (8192, 2048)),
    "cold_seed_001": (("target",), None),  # MNNVL
    "two_engines_no_teardown_narrower": (("target",), (8192, 2048)),
    "cold_tp4_budget": (("target", "draft"), None),  # see below
    "fused_ranges_tp4": (("target", "draft"), None),  # a draft model: own ranges
}
# start orders that work on every tree (vLLM's warm-up before capture)
NOT_A_BUG = ["capture_order_seed_001"]
TREES = [(p[:4], p, "after") for p in SERIES]


@pytest.mark.slow
@pytest.mark.parametrize(("label", "patch", "when"), TREES, ids=[t[0] for t in TREES])
@pytest.mark.parametrize(
    "case", [c for c in UNAFFECTED if UNAFFECTED[c][1] or c == "cold_seed_001"]
)
def test_unaffected_configs(suite, label, patch, when, case):
    res = suite(patch, when, case)
    models, shape = UNAFFECTED[case]
    _fused_everywhere_ok(res, models)
    if shape is not None:
        assert _shape(res) == shape


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [c for c in UNAFFECTED if UNAFFECTED[c][1] or c == "cold_seed_001"]
)
def test_no_extra_memory_with_one_width_or_a_narrower_draft(suite, case):
    first = suite(SERIES[0], "after", case)["workspaces"]["_fi_ar_workspace"]["bytes"]
    for patch in SERIES[1:]:
        assert suite(patch, "after", case)["workspaces"]["_fi_ar_workspace"]["bytes"] == first


@pytest.mark.slow
def test_budget_limited_plan_holds_the_largest_problem(suite):
    """SM90 TP4 (2 MiB budget): target (2048) fuses up to 512 tokens and the
    drafter (2560) up to 409, exactly as on pristine (+0001), from one
    workspace that holds the larger of the two problems (512 x 2048
    elements) in rows of the widest model: 410 x 2560, 32 KiB more than
    pristine's 512 x 2048, which the drafter's 409 x 2560 fits by 1536
    elements."""
    before = suite(SERIES[0], "after", "cold_tp4_budget")
    assert _shape(before) == (512, 2048)
    for patch in SERIES[SERIES.index(SIZING) :]:
        after = suite(patch, "after", "cold_tp4_budget")
        _fused_everywhere_ok(after)
        for model, limit in (("target", 512), ("draft", 409)):
            fused = after["plans"][model]["fused_ranges"]
            assert fused == before["plans"][model]["fused_ranges"], (patch, model, fused)
            assert fused[-1][1] == limit, (patch, model, fused)
        assert _shape(after) == (410, 2560)
        bytes_ = after["workspaces"]["_fi_ar_workspace"]["bytes"]
        assert bytes_ - before["workspaces"]["_fi_ar_workspace"]["bytes"] == 32 * 1024


@pytest.mark.slow
def test_every_model_keeps_its_fused_range(suite):
    """Wherever a case compiles its models on pristine v0.27.1 (+0001), every
    tree of the series that runs the case fuses the same compile ranges for
    each model (a tree before the case's fix may fail it), except what the
    fused-range patch bounds by the budget; the whole series runs every
    case."""
    for case in bug_a.suite_cases():
        ranges = _fused_ranges(suite(SERIES[0], "after", case))
        if not ranges or case in FIXED_BY[RANGES]:
            continue
        for patch in SERIES[1:]:
            res = suite(patch, "after", case)
            if "error" in res and patch != SERIES[-1]:
                fixed_by = next(p for p, cases in FIXED_BY.items() if case in cases)
                assert SERIES.index(patch) < SERIES.index(fixed_by), (case, patch, res)
                continue
            assert _fused_ranges(res) == ranges, (case, patch, res, ranges)


def _fused_ranges(res: dict) -> dict | None:
    if "plans" in res:
        return {k: p["fused_ranges"] for k, p in res["plans"].items()}
    if "fused_ranges" in res:
        return res["fused_ranges"]
    if "plan" in res:
        return {"second": res["plan"]["fused_ranges"]}
    return None
