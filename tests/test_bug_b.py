# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug B (seed 001, issue 4): the one-shot all-reduce threshold in two units.

The scenarios (scripts/tpfix/replay/bug_b.py) run the tree's real vLLM code (the
compiled op ``call_trtllm_fused_allreduce_norm``, the workspace planning and
creation of ``flashinfer_all_reduce``) on FlashInfer's real Python layer; only
GPU memory, kernel launches and the TP group are simulated (see the scenario
module's docstring for the exact list).

"Before" is the series without this patch (v0.27.1 + FlashInfer 0.6.16.post4
+ bug A's workspace plan).  v0.27.1 no longer crashes as shipped, because
vllm#47589 made vLLM stop deciding on MNNVL (it passes ``use_oneshot=None``
and FlashInfer's AUTO decides); ``as_shipped`` therefore fits before and after,
and the tests say so.  The defect that remains, and that the red tests show,
is vLLM's own one-shot policy: its selection function and table, in per-rank
bytes, choose one-shot for sizes the MNNVL workspace it allocated cannot hold
(the reason it has to be ignored there).  Before the patch the scenario
applies that table on MNNVL the way the tree applies it on TRT-LLM (and the
way vLLM did on MNNVL before vllm#47589); after the patch the tree decides on
MNNVL itself and nothing is forced.

Tiers: the seed replay and the narrower model (the patch header's
`Scenario:`), red before and green after, are the fast tier; the property
test over generated configurations and the standalone all-reduce are slow.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tpfix.replay.bug_b import NARROW_DRAFT
from tpfix.replay.harness import run_scenario, tree_after, tree_before

PATCH = "0003-allreduce-fusion-one-shot-threshold-in-one-unit.patch"


def _before_and_after(spec: str, **kwargs) -> tuple[dict, dict]:
    """One scenario on the tree before and the tree after the patch, the two
    subprocesses concurrently (they are independent)."""
    trees = tree_before(PATCH), tree_after(PATCH)
    with ThreadPoolExecutor(max_workers=2) as pool:
        before, after = (pool.submit(run_scenario, t, spec, **kwargs) for t in trees)
        return before.result(), after.result()


@pytest.fixture(scope="module")
def seed():
    return _before_and_after("bug_b:seed_replay")


@pytest.fixture(scope="module")
def seed_before(seed):
    return seed[0]


@pytest.fixture(scope="module")
def seed_after(seed):
    return seed[1]


def test_seed_arithmetic_with_flashinfer_functions(seed_before, seed_after):
    for result in (seed_before, seed_after):
        assert "error" not in result, result
        a = result["arithmetic"]
        assert a["max_token_num"] == 42  # 524288 // (6144 * 2)
        assert a["flashinfer_oneshot_tokens"] == 10  # 1 MiB // (8 * 2 * 6144)
        assert a["oneshot_at_threshold"] == 983040
        assert a["twoshot_at_max"] == 1179648
        assert a["buffer"] == 1179648
        assert a["oneshot_at_40"] == 3932160


def test_seed_before_vllm_policy_exceeds_allocation(seed_before):
    """Red before: vLLM's table picks one-shot for N <= 42, the MNNVL buffer
    holds one-shot up to N = 12; FlashInfer raises the seed's error."""
    run = seed_before["runs"]["mnnvl_vllm_policy"]
    assert run["vllm_table_forced_on_mnnvl"] is True
    assert seed_before["policy_failing_tokens"] == list(range(13, 43))
    assert seed_before["policy_error_at_40"] == (
        "ValueError: The buffer size in the given workspace is insufficient "
        "for the given problem size. Buffer: 1179648 bytes, Required: "
        "3932160 bytes."
    )
    # as shipped (vllm#47589) the tree defers to FlashInfer's AUTO and fits
    assert seed_before["runs"]["mnnvl_as_shipped"]["failures"] == 0


def test_seed_after_every_token_count_fits(seed_after):
    for name, run in seed_after["runs"].items():
        assert run["vllm_table_forced_on_mnnvl"] is False, name
        assert run["checked"] == 42 and run["unfused"] == 0, (name, run)
        assert run["failures"] == 0, (name, run["failure_examples"])
    mnnvl = seed_after["runs"]["mnnvl_vllm_policy"]
    # MNNVL policy: FlashInfer's 1 MiB crossover, N <= 10, no extra memory
    assert mnnvl["oneshot_tokens"] == {"6144": [[1, 10]]}
    assert mnnvl["mnnvl_buffer_size_bytes"] == 1179648
    # TRT-LLM keeps vLLM's table: one-shot for all 42 tokens
    assert seed_after["runs"]["trtllm_as_shipped"]["oneshot_tokens"] == {"6144": [[1, 42]]}


def test_narrower_model_gets_a_strategy_the_workspace_holds():
    """The workspace is planned at the widest model (6144): FlashInfer reserves
    one-shot for floor(1 MiB / (8 * 2 * 6144)) = 10 rows = 983040 bytes.  For
    the 4096-wide model at N = 16, FlashInfer's AUTO (1 MiB rule) asks for
    one-shot, 1048576 bytes: FlashInfer raises (with a 16-token limit the
    buffer holds no more than that one-shot room).  After the patch vLLM
    requests two-shot."""
    before, after = _before_and_after("bug_b:run_case", **NARROW_DRAFT)
    assert "error" not in before and "error" not in after, (before, after)
    assert before["failures"] + before["unfused"] == 1, before
    assert after["failures"] == 0 and after["unfused"] == 0, after
    assert after["oneshot_tokens"]["4096"] == [[1, 15]]
    assert after["twoshot_tokens"]["4096"] == [[16, 16]]


# ---------------------------------------------------------------------------
# Property: requested strategy's required bytes <= allocated bytes, always
# ---------------------------------------------------------------------------
WIDTHS = [896, 1024, 2048, 2560, 4096, 5120, 6144, 7168, 8192, 12288, 16384]


@st.composite
def _case(draw):
    backend = draw(st.sampled_from(["mnnvl", "trtllm"]))
    tp = draw(st.sampled_from([2, 4, 8] + ([16] if backend == "mnnvl" else [])))
    target = draw(st.sampled_from(WIDTHS))
    # None: no drafter; otherwise a draft as wide, narrower or wider
    draft = draw(st.none() | st.sampled_from(WIDTHS))
    return {
        "backend": backend,
        "capability": draw(st.sampled_from([90, 100, 103, 107])),
        "tp": tp,
        "widths": [target] if draft is None else [target, draft],
        "dtype": draw(st.sampled_from(["bfloat16", "float16", "float32"])),
        "limit": draw(st.sampled_from([8, 16, 42, 128, 512, 2048, 8192, 16384])),
        # None: the tree's default budget for (capability, TP)
        "budget_mb": draw(st.sampled_from([None, None, 0.25, 0.5, 1, 2, 4, 64])),
    }


def _generate_cases(n: int) -> list[dict]:
    cases: list[dict] = []

    @settings(
        max_examples=n, derandomize=True, database=None, phases=[Phase.generate], deadline=None
    )
    @given(_case())
    def collect(case):
        cases.append(case)

    collect()
    return cases


CASES = _generate_cases(150) + [NARROW_DRAFT]


@pytest.fixture(scope="module")
def properties():
    return _before_and_after("bug_b:property_cases", cases=CASES)


@pytest.fixture(scope="module")
def property_before(properties):
    return properties[0]


@pytest.fixture(scope="module")
def property_after(properties):
    return properties[1]


@pytest.mark.slow
def test_property_before_fails(property_before):
    """Red before: vLLM's own one-shot policy exceeds the allocation in some
    generated cases (all on MNNVL).  As shipped (FlashInfer's AUTO on MNNVL)
    only a tensor narrower than the workspace fails: the mixed-width cases
    on MNNVL whose buffer is below FlashInfer's 1 MiB one-shot threshold."""
    r = property_before
    assert "error" not in r, r
    print(
        f"before: {r['policy_failing_cases']}/{r['n_cases']} cases fail "
        f"(vLLM policy), {r['as_shipped_failing_cases']} as shipped, "
        f"{r['checked']} (case, width, N) checks, "
        f"{r['as_shipped_unfused']} fell back to unfused as shipped"
    )
    assert r["policy_failing_cases"] > 0
    assert all(ex["case"]["backend"] == "mnnvl" for ex in r["failing_examples"]), r[
        "failing_examples"
    ]
    assert r["as_shipped_failing_cases"] == len(r["as_shipped_failing"]) > 0, r
    for case in r["as_shipped_failing"]:
        assert case["backend"] == "mnnvl" and len(set(case["widths"])) > 1, case


@pytest.mark.slow
def test_property_after_always_fits(property_after):
    r = property_after
    assert "error" not in r, r
    print(
        f"after: {r['policy_failing_cases']}/{r['n_cases']} cases fail, "
        f"{r['checked']} (case, width, N) checks, {r['unfused']} unfused"
    )
    assert r["checked"] > 0
    assert r["policy_failing_cases"] == 0, r["failing_examples"]
    assert r["as_shipped_failing_cases"] == 0, r
    # with the plan of bug A and a servable strategy, nothing falls back
    assert r["unfused"] == 0 and r["as_shipped_unfused"] == 0, r


# The standalone FlashInfer all-reduce (VLLM_ALLREDUCE_USE_FLASHINFER=1) on
# MNNVL, SM90 TP8: Qwen3-14B (5120) with a Qwen3-8B draft (4096), 16 tokens.
# The shared workspace reserves one-shot room for 12 rows of 5120; a 4096-wide
# input of 16 tokens is 1 MiB, which FlashInfer's AUTO sends one-shot.
STANDALONE_NARROW = dict(
    target_hidden=5120,
    draft_hidden=4096,
    tp=8,
    capability=90,
    max_num_batched_tokens=16,
    backend="mnnvl",
)


@pytest.mark.slow
def test_standalone_narrower_input_fits():
    """Runs tpfix/replay/bug_a.py:standalone (FlashInferAllReduce's real
    should_use_fi_ar / all_reduce and FlashInfer's real MNNVL checks)."""
    before, after = _before_and_after("bug_a:standalone", **STANDALONE_NARROW)
    assert before.get("error") == "ValueError", before
    assert "insufficient" in before["message"], before["message"]
    assert "error" not in after, after
    assert 16 in after["accepted"]["draft"] and 16 in after["accepted"]["target"]
