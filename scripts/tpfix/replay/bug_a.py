# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A scenarios (seed 000, issue 3): the FlashInfer all-reduce fusion
workspace under speculative decoding with TP > 1.

Each scenario is a public function that ``harness.run_scenario`` runs in a
fresh interpreter with ``PYTHONPATH=<vLLM tree>:<FlashInfer>:scripts`` and
that returns a JSON-serialisable dict.  A scenario named by a patch
header's ``Scenario:`` field has its verdict ``check_<scenario>`` next to it
(replay.verdict): in its module, and here.  The replays run on every tree
of the series, on pristine v0.27.1 and on v0.33.0 trees: what a tree lacks
(the workspace plan, the failure latches) is looked up with ``hasattr``.

What is REAL (taken from the vLLM tree under test and the installed FlashInfer):
  * vLLM's configuration: ``ModelConfig`` (from local ``config.json`` files, no
    weights), ``SpeculativeConfig``, ``VllmConfig.__post_init__`` (compile
    ranges, CUDA graph capture sizes and warm-up count as it sets them on a
    platform with static graph support, like CUDA), the drafter's
    configuration via ``DraftModelProposer._create_draft_vllm_config``;
  * the worker's ``init_worker_distributed_environment`` and
    ``Worker.load_model`` (gpu_worker.py; with the series it creates the
    workspace through ``init_fi_ar_fusion_workspace``);
  * ``CudaCommunicator.destroy()`` of the TP group (``destroy_model_parallel``);
  * ``AllReduceFusionPass`` (sizing, workspace creation, pattern registration,
    ``is_applicable_for_range``), the custom op
    ``call_trtllm_fused_allreduce_norm`` and everything in
    ``flashinfer_all_reduce.py`` (plan, getters, creation, agreement,
    ``FlashInferAllReduce``);
  * FlashInfer's Python layer: ``allreduce_fusion`` dispatch,
    ``trtllm_allreduce_fusion`` / ``trtllm_mnnvl_*`` argument and workspace
    validation (``check_trtllm_allreduce_fusion_workspace_metadata``,
    ``is_buffer_size_sufficient``), ``MNNVLAllReduceFusionWorkspace``
    sizing helpers and thresholds.
What is SIMULATED (there is no GPU) is the device layer ``device.setup()``
installs (scripts/tpfix/replay/device.py, whose docstring lists it): the
CUDA platform, torch.distributed (a fake TP group, one peer standing for the
other ranks), GPU allocation (FlashInfer's real workspace classes built with
``cls.__new__`` and sized with FlashInfer's own formulas, refused while a
CUDA graph is captured), CUDA graph capture (a flag), the kernels (CPU
reference kernels behind FlashInfer's launch code), vLLM's ``torch.ops._C``
ops (``vllm_cpu_stubs``) and "a new process" (``device.new_process()``);
and, by the engine drivers of ``tpfix.replay.engine``, the model runner and
a model loaded from the AOT compile cache (engine's docstring).

The scenarios live by concern in modules beside this one, which import
nothing from this one; it re-exports each scenario and its verdict
(``harness.run_scenario`` runs "bug_a:fn", ``harness.scenario_check`` looks
up ``check_fn`` and a ``Scenario:`` field's keyword set here):
  * bug_a_starts.py: ``cold_start``, ``warm_start``,
    ``warm_start_capture_order`` (the seed starts, CUDA graph capture);
  * bug_a_budget.py: ``standalone``, ``fused_ranges`` (the fusion's byte
    budget);
  * bug_a_lifetime.py: ``creation_failure``, ``capture_first_use``,
    ``drafter_pass_collected``, ``two_engines`` (creation, capture, garbage
    collection, teardown);
  * bug_a_property.py: ``property_fits`` (every shape fits, Hypothesis).
This module holds the seed's message and configurations, the keyword sets
that patch headers' ``Scenario:`` fields name, and ``suite_cases`` /
``suite`` (the named cases the tests replay on every tree).
"""

from __future__ import annotations

import contextlib
from typing import Any

from tpfix.replay.bug_a_budget import check_fused_ranges, check_standalone, fused_ranges, standalone
from tpfix.replay.bug_a_lifetime import (
    capture_first_use,
    check_creation_failure,
    check_drafter_pass_collected,
    creation_failure,
    drafter_pass_collected,
    two_engines,
)
from tpfix.replay.bug_a_property import property_fits
from tpfix.replay.bug_a_starts import (
    check_cold_start,
    check_warm_start,
    check_warm_start_capture_order,
    cold_start,
    warm_start,
    warm_start_capture_order,
)
from tpfix.replay.device import new_process

__all__ = [
    "EAGLE_WIDER",
    "NARROW_DRAFT",
    "PEER_FAILS",
    "SEED_000",
    "SEED_001",
    "SEED_MESSAGE",
    "STANDALONE_SMALL_BUDGET",
    "WARM_STANDALONE_FIRST",
    "capture_first_use",
    "check_cold_start",
    "check_creation_failure",
    "check_drafter_pass_collected",
    "check_fused_ranges",
    "check_standalone",
    "check_warm_start",
    "check_warm_start_capture_order",
    "cold_start",
    "creation_failure",
    "drafter_pass_collected",
    "fused_ranges",
    "property_fits",
    "standalone",
    "suite",
    "suite_cases",
    "two_engines",
    "warm_start",
    "warm_start_capture_order",
]

SEED_MESSAGE = (
    "token_num (8192) * hidden_dim (2560) exceeds workspace max_token_num "
    "(8192) * hidden_dim (2048)"
)
# The two seed configurations (bug A's seed 000, bug B's seed 001).
SEED_000 = {
    "target_hidden": 2048,
    "draft_hidden": 2560,
    "tp": 2,
    "capability": 90,
    "max_num_batched_tokens": 8192,
    "backend": "trtllm",
}
SEED_001 = {
    "target_hidden": 6144,
    "draft_hidden": None,
    "tp": 8,
    "capability": 90,
    "max_num_batched_tokens": 8192,
    "backend": "mnnvl",
}
# cold_start(**NARROW_DRAFT): Qwen3-32B (5120) with a Qwen3-8B draft model
# (4096), SM90 TP4 (2 MiB budget): the budget limits the tokens, and the
# narrower draft fuses more elements than the widest model's rows hold.
NARROW_DRAFT = {"target_hidden": 5120, "draft_hidden": 4096, "tp": 4, "fusion_max_size_mb": 2}
# warm_start(**WARM_STANDALONE_FIRST): NARROW_DRAFT's models at SM90 TP4 (its
# default 2 MiB budget), warm, the standalone FlashInfer all-reduce on and run
# first: its rows at the target's width (204 x 5120) do not hold the draft's
# fused 256 x 4096, unless the workspace was made for the engine before it
# ran (v0.27.1's 0003 creates it when the worker loads the models).
WARM_STANDALONE_FIRST = {
    "target_hidden": 5120,
    "draft_hidden": 4096,
    "tp": 4,
    "standalone_first": True,
}
# creation_failure(**PEER_FAILS): this rank's creation succeeds, a peer's fails.
PEER_FAILS = {"where": "peer"}
# fused_ranges(**EAGLE_WIDER): an EAGLE-3 head (2560) wider than its target
# (2048), compiled with the target's config, SM90 TP4 (2 MiB budget).
EAGLE_WIDER = {"spec_method": "eagle3"}
# standalone(**STANDALONE_SMALL_BUDGET): SM90 TP2, a fusion budget set below
# the default (1 of 64 MiB; the standalone FlashInfer all-reduce of v0.27.x
# bounds its inputs by the default), a cold start: the fusion passes create
# the workspace before the first all-reduce.
STANDALONE_SMALL_BUDGET = {"tp": 2, "fusion_max_size_mb": 1, "passes_first": True}


def suite_cases() -> dict[str, tuple[Any, dict]]:
    """The named cases of ``suite``: name -> (scenario function, kwargs)."""
    return {
        "cold_seed": (cold_start, {}),
        "warm_seed": (warm_start, {}),
        "cold_quant_fp8": (cold_start, {"pattern": "kARResidualRMSNormFP8Quant"}),
        "warm_quant_first": (
            warm_start,
            {"target_pattern": "kARResidualRMSNormFP8Quant"},
        ),
        "cold_narrow_draft": (cold_start, {"target_hidden": 4096, "draft_hidden": 2048}),
        "warm_narrow_draft": (warm_start, {"target_hidden": 4096, "draft_hidden": 2048}),
        "cold_equal": (cold_start, {"target_hidden": 2048, "draft_hidden": 2048}),
        "warm_equal": (warm_start, {"target_hidden": 2048, "draft_hidden": 2048}),
        "cold_no_spec": (cold_start, {"draft_hidden": None}),
        "warm_no_spec": (warm_start, {"draft_hidden": None}),
        "cold_tp4_budget": (cold_start, {"tp": 4}),
        "warm_mnnvl_sm100": (warm_start, {"backend": "mnnvl", "capability": 100, "tp": 4}),
        "warm_standalone_first_narrow_draft": (warm_start, WARM_STANDALONE_FIRST),
        "capture_order_seed_000": (warm_start_capture_order, SEED_000),
        "capture_order_seed_000_no_warmup": (
            warm_start_capture_order,
            {**SEED_000, "num_warmups": 0},
        ),
        "capture_order_seed_001": (warm_start_capture_order, SEED_001),
        "capture_order_seed_001_no_warmup": (
            warm_start_capture_order,
            {**SEED_001, "num_warmups": 0},
        ),
        "cold_seed_001": (cold_start, SEED_001),
        "standalone_tp4": (standalone, {}),
        "standalone_small_budget": (standalone, STANDALONE_SMALL_BUDGET),
        "fused_ranges_tp4": (fused_ranges, {}),
        "fused_ranges_eagle_wider": (fused_ranges, EAGLE_WIDER),
        "fail_local": (creation_failure, {"where": "local"}),
        "fail_peer": (creation_failure, PEER_FAILS),
        "fail_local_mnnvl": (creation_failure, {"where": "local", "backend": "mnnvl"}),
        "fail_peer_mnnvl": (creation_failure, {**PEER_FAILS, "backend": "mnnvl"}),
        "capture_first_use": (capture_first_use, {}),
        "drafter_collected": (drafter_pass_collected, {}),
        "two_engines": (two_engines, {}),
        "two_engines_first_failed": (two_engines, {"first_fails": True}),
        "two_engines_no_teardown": (two_engines, {"teardown": False}),
        "two_engines_no_teardown_narrower": (
            two_engines,
            {"teardown": False, "second_hidden": 1024},
        ),
    }


def suite(names: list[str] | None = None) -> dict:
    """Run the named cases of ``suite_cases`` (all, or those in ``names``) in
    this one interpreter, each in a simulated new process; an exception is
    reported as {"error", "message"}."""
    out = {}
    for name, (fn, kwargs) in suite_cases().items():
        if names is not None and name not in names:
            continue
        try:
            out[name] = fn(**kwargs)
        except Exception as e:  # reported, like the harness does
            out[name] = {"error": type(e).__name__, "message": str(e)}
        finally:
            with contextlib.suppress(Exception):
                new_process()
    return out
