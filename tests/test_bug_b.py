# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug B (seed 001, issue 4): the one-shot all-reduce threshold in two units,
and a request that does not fit a workspace shared by models of different
widths.

The scenarios (scripts/tpfix/replay/bug_b.py) run the tree's real vLLM code (the
compiled op ``call_trtllm_fused_allreduce_norm``, the workspace creation at
load ``init_fi_ar_fusion_workspace`` where the tree has it, and the creation
of ``flashinfer_all_reduce``) on FlashInfer's real Python layer; only GPU
memory (with the MNNVL allocation granularity as a parameter), kernel
launches and the TP group are simulated (see the scenario module's docstring
and replay/recorder.py's for the exact list).

The trees: "pristine" is v0.27.1 + 0001 (FlashInfer 0.6.16.post4, which
imports on this Python), "series" the whole series.

The seed's crash is vLLM's own one-shot table (per-rank bytes) applied on
MNNVL, where FlashInfer sizes the buffer for its own threshold (all-reduce
bytes).  v0.27.1 no longer does that as shipped (vllm#47589: it passes
``use_oneshot=None`` on MNNVL and FlashInfer's AUTO decides), and no patch
of the series changes it: the scenario still forces the table on MNNVL (as
vLLM did before vllm#47589) to replay the seed's numbers, on both trees.
What remains as shipped is a tensor narrower than the workspace's width (a
draft narrower than the target): FlashInfer reserves one-shot room in whole
rows of the workspace's width, so its AUTO choice can exceed the buffer by
less than a row.  Whether it does depends on the device's allocation
granularity (hardware data): at granularity 1 (the smallest buffer
FlashInfer can end up with) it does, on pristine and with the series alike;
at 2 MiB no case does.  The series carries no fix for it (an earlier one,
asking the workspace in the fused op, had no realistic trigger); these tests
show that the series makes no case worse.

Tiers: the seed replay and the narrower model are the fast tier; the
property test over generated configurations and the standalone all-reduce
are slow.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.replay.bug_b import MIB2, NARROW_DRAFT, check_run_case
from tpfix.replay.harness import (
    run_scenario,
    run_scenarios,
    tree_after,
)

SERIES = read_series(get_line().series)
TREES = {"before": lambda: tree_after(SERIES[0]), "after": lambda: tree_after(SERIES[-1])}
GRANULARITIES = {"1 B": 1, "2 MiB": MIB2}


def _run_all(jobs: dict) -> dict:
    """Each ``(spec, kwargs)`` job on each tree of {label: tree}, one
    subprocess each, concurrently (they are independent)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            key: pool.submit(run_scenario, tree, spec, **kwargs)
            for key, (tree, spec, kwargs) in jobs.items()
        }
        return {key: fut.result() for key, fut in futures.items()}


@pytest.fixture(scope="module")
def fast() -> dict[str, tuple[dict, dict]]:
    """The fast tier's scenarios (the seed replay; NARROW_DRAFT at both
    granularities) on pristine ("before") and the series ("after"): one
    interpreter per tree runs both (bug_b's cases reset what they set up),
    the two trees concurrently.  {"seed" | "narrow": (before, after)}."""
    jobs = [
        ("bug_b:seed_replay", {}),
        (
            "bug_b:run_case_at",
            {"granularities": list(GRANULARITIES.values()), **NARROW_DRAFT},
        ),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run_scenarios, f(), jobs) for f in TREES.values()]
        (seed_b, narrow_b), (seed_a, narrow_a) = (fut.result() for fut in futures)
    return {"seed": (seed_b, seed_a), "narrow": (narrow_b, narrow_a)}


@pytest.fixture(scope="module")
def seed_before(fast):
    return fast["seed"][0]


@pytest.fixture(scope="module")
def seed_after(fast):
    return fast["seed"][1]


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


def test_seed_vllm_table_on_mnnvl_exceeds_allocation(seed_before, seed_after):
    """The seed's crash: vLLM's table picks one-shot for N <= 42, the MNNVL
    buffer holds one-shot up to N = 12; FlashInfer raises the seed's error.
    vllm#47589 stopped applying the table on MNNVL; the series does not
    change it, so forcing it fails alike on both trees."""
    for result in (seed_before, seed_after):
        run = result["runs"]["mnnvl_vllm_policy"]
        assert run["vllm_table_forced_on_mnnvl"] is True
        assert result["policy_failing_tokens"] == list(range(13, 43))
        assert result["policy_error_at_40"] == (
            "ValueError: The buffer size in the given workspace is insufficient "
            "for the given problem size. Buffer: 1179648 bytes, Required: "
            "3932160 bytes."
        )


@pytest.mark.parametrize("when", ["before", "after"])
def test_seed_as_shipped_every_token_count_fits(seed_before, seed_after, when):
    result = seed_before if when == "before" else seed_after
    for name in ("mnnvl_as_shipped", "trtllm_as_shipped"):
        run = result["runs"][name]
        assert run["vllm_table_forced_on_mnnvl"] is False, name
        assert run["checked"] == 42 and run["unfused"] == 0, (name, run)
        assert run["failures"] == 0, (name, run["failure_examples"])
    mnnvl = result["runs"]["mnnvl_as_shipped"]
    # FlashInfer's AUTO on MNNVL: its 1 MiB crossover, N <= 10, no extra memory
    assert mnnvl["oneshot_tokens"] == {"6144": [[1, 10]]}
    assert mnnvl["mnnvl_buffer_size_bytes"] == 1179648
    # TRT-LLM keeps vLLM's table: one-shot for all 42 tokens
    assert result["runs"]["trtllm_as_shipped"]["oneshot_tokens"] == {"6144": [[1, 42]]}


@pytest.fixture(scope="module")
def narrow(fast):
    """NARROW_DRAFT before and after the patch at both granularities."""
    runs = fast["narrow"]
    res = {}
    for when, by_granularity in zip(("before", "after"), runs, strict=True):
        assert "error" not in by_granularity, by_granularity
        for label, g in GRANULARITIES.items():
            res[(label, when)] = by_granularity[str(g)]
    for (label, when), r in res.items():
        assert "error" not in r, r
        print(
            f"[bug B narrow draft] granularity {label}, {when}: buffer "
            f"{r['mnnvl_buffer_size_bytes']} B, {r['failures']} failures, "
            f"{r['unfused']} unfused of {r['checked']}; 4096-wide one-shot "
            f"{r['oneshot_tokens']['4096']}, two-shot {r['twoshot_tokens']['4096']}"
        )
    return res


def test_narrower_model_at_granularity_1_alike_on_both_trees(narrow):
    """The workspace at the widest model (6144) for 16 tokens: FlashInfer
    reserves one-shot for floor(1 MiB / (8 * 2 * 6144)) = 10 rows = 983040
    bytes (granularity 1).  For the 4096-wide model at N = 16, FlashInfer's
    AUTO (1 MiB rule) asks for one-shot, 1048576 bytes: FlashInfer raises, on
    pristine (the target's op creates that workspace, or, where the tag sizes
    the pass for the widest model as v0.33.0 does (vllm#52193), the pass)
    and with the series (the worker creates it at load) alike."""
    before, after = narrow[("1 B", "before")], narrow[("1 B", "after")]
    assert before["planned_shape"] in (None, [16, 6144]), before
    assert after["planned_shape"] == [16, 6144]
    assert before["mnnvl_buffer_size_bytes"] == after["mnnvl_buffer_size_bytes"] == 983040
    for r in (before, after):
        assert check_run_case(r) is False
        (failure,) = r["failure_examples"]
        assert (failure["hidden"], failure["num_tokens"]) == (4096, 16)
        assert "Buffer: 983040 bytes, Required: 1048576 bytes" in failure["error"]


def test_narrower_model_at_2mib_granularity_fits_on_both_trees(narrow):
    """With a 2 MiB granularity the allocation rounds the same request up to
    4 MiB (buffer 1397408 B per Lamport buffer): FlashInfer's one-shot at
    N = 16 fits."""
    for r in (narrow[("2 MiB", "before")], narrow[("2 MiB", "after")]):
        assert r["mnnvl_buffer_size_bytes"] == 1397408
        assert check_run_case(r) is True
        assert r["oneshot_tokens"]["4096"] == [[1, 16]]
        assert r["twoshot_tokens"]["4096"] == []


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
    """property_cases on both trees at both granularities, printed."""
    jobs = {
        (label, when): (f(), "bug_b:property_cases", {"cases": CASES, "granularity": g})
        for label, g in GRANULARITIES.items()
        for when, f in TREES.items()
    }
    res = _run_all(jobs)
    for (label, when), r in res.items():
        assert "error" not in r, r
        print(
            f"[bug B property] granularity {label}, {when}: "
            f"{r['as_shipped_failing_cases']}/{r['n_cases']} cases fail as shipped, "
            f"{r['as_shipped_unfused']} unfused calls; vLLM table forced on MNNVL: "
            f"{r['policy_failing_cases']} cases fail; {r['checked']} (case, width, N) checks"
        )
    return res


def _mixed_mnnvl(case: dict) -> bool:
    return case["backend"] == "mnnvl" and len(set(case["widths"])) > 1


@pytest.mark.slow
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_property_series_is_never_worse_than_pristine(properties, granularity):
    """As shipped (FlashInfer's AUTO on MNNVL): every case that fails with
    the series fails on pristine too, and no fused call falls back."""
    before, after = properties[(granularity, "before")], properties[(granularity, "after")]
    assert after["checked"] > 0
    assert all(c in before["as_shipped_failing"] for c in after["as_shipped_failing"]), after
    assert after["as_shipped_unfused"] == 0, after


@pytest.mark.slow
def test_property_series_fails_only_for_narrower_tensors_on_mnnvl(properties):
    """What fails with the series at granularity 1 is a tensor narrower than
    the workspace on MNNVL (NARROW_DRAFT among them); at 2 MiB nothing."""
    fine = properties[("1 B", "after")]["as_shipped_failing"]
    assert all(_mixed_mnnvl(c) for c in fine), fine
    assert NARROW_DRAFT in fine
    assert properties[("2 MiB", "after")]["as_shipped_failing_cases"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_property_vllm_table_on_mnnvl_fails_no_more_with_the_series(properties, granularity):
    """The table of vLLM forced on MNNVL (the seed's policy) exceeds the
    allocation on both trees: the series does not change vLLM's table
    (v0.27.1 ships use_oneshot=None on MNNVL), and its workspace, made for
    every model at load, fails in no more cases than pristine's; all
    failures are on MNNVL."""
    before, after = properties[(granularity, "before")], properties[(granularity, "after")]
    assert 0 < after["policy_failing_cases"] <= before["policy_failing_cases"], (before, after)
    assert all(ex["case"]["backend"] == "mnnvl" for ex in after["failing_examples"])


# The standalone FlashInfer all-reduce (VLLM_ALLREDUCE_USE_FLASHINFER=1) on
# MNNVL, SM90 TP8: Qwen3-14B (5120) with a Qwen3-8B draft (4096), 16 tokens.
# The workspace created at load (16 x 5120) reserves one-shot room for 12
# rows of 5120 (983040 B at granularity 1); a 4096-wide input of 16 tokens
# is 1 MiB, which FlashInfer's AUTO sends one-shot.
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
    """Runs tpfix/replay/bug_a_budget.py:standalone (FlashInferAllReduce's real
    should_use_fi_ar / all_reduce and FlashInfer's real MNNVL checks, at
    granularity 1) on every tree of the series.  On pristine v0.27.1 (+0001)
    the standalone all-reduce sizes the workspace itself for its 51-token
    budget at its first (5120-wide) input, whose two-shot room (1146880 B)
    holds that one-shot.  From the sizing patch on, the worker creates the
    workspace at load (16 x 5120), whose one-shot room does not hold it: the
    standalone all-reduce asks the workspace (0002, vllm#50932, ahead of the
    sizing patch) and leaves the 16-token draft input to the other
    all-reduce backends, so no tree fails."""
    trees = {n: tree_after(n) for n in SERIES}
    res = _run_all({n: (t, "bug_a:standalone", STANDALONE_NARROW) for n, t in trees.items()})
    assert "error" not in res[SERIES[0]] and 16 in res[SERIES[0]]["accepted"]["draft"], res
    for name in SERIES[1:]:
        assert "error" not in res[name], (name, res[name])
    assert res[SERIES[-1]]["accepted"] == {"target": [1, 2, 16], "draft": [1, 2]}, res
