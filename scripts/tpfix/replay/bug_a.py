# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A scenarios (seed 000, issue 3): the FlashInfer all-reduce fusion
workspace under speculative decoding with TP > 1.

Each public function is a scenario that ``harness.run_scenario`` runs in a
fresh interpreter with ``PYTHONPATH=<vLLM tree>:<FlashInfer>:scripts``
and that returns a JSON-serialisable dict.  A scenario named by a patch
header's ``Scenario:`` field has its verdict ``check_<scenario>`` next to it
(replay.verdict).  The replays run on every tree of the series, on pristine
v0.27.1 and on v0.33.0 trees: what a tree lacks (the workspace plan, the
failure latches) is looked up with ``hasattr``.

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
"""

from __future__ import annotations

import contextlib
from typing import Any

from tpfix.replay.device import CAPTURE_REFUSAL, new_process, setup, state
from tpfix.replay.engine import (
    compile_plan,
    draft_config,
    engine_config,
    fits,
    forward,
    forward_all,
    fusion_covers_budget,
    fusion_pass,
    kernel_calls,
    teardown_tp_group,
    worker_init,
    workspaces,
)
from tpfix.replay.flashinfer_sim import workspace_bytes
from tpfix.replay.verdict import by_exception

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
# creation_failure(**PEER_FAILS): this rank's creation succeeds, a peer's fails.
PEER_FAILS = {"where": "peer"}
# fused_ranges(**EAGLE_WIDER): an EAGLE-3 head (2560) wider than its target
# (2048), compiled with the target's config, SM90 TP4 (2 MiB budget).
EAGLE_WIDER = {"spec_method": "eagle3"}


# --------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------
def cold_start(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    pattern="kARResidualRMSNorm",
):
    """Seed config, empty compile cache: the worker starts, the compiler builds
    the target's fusion pass, then the drafter's, then the profile run sends
    ``max_num_batched_tokens`` tokens through target and drafter."""
    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}
    dcfg = None
    if draft_hidden is not None:
        dcfg = draft_config(cfg)
        plans["draft"] = compile_plan(dcfg, fusion_pass(dcfg))
    results = {}
    for name, plan in plans.items():
        results[name] = forward_all(plan, max_num_batched_tokens, pattern)
    covers = {
        "target": fusion_covers_budget(cfg, plans["target"]),
    }
    if dcfg is not None:
        covers["draft"] = fusion_covers_budget(dcfg, plans["draft"])
    return {
        "plans": plans,
        "forward": results,
        "workspaces": workspaces(),
        "created": list(state["created"]),
        "kernel_calls": kernel_calls(),
        "fusion_covers_budget": covers,
    }


def warm_start(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    target_pattern="kARResidualRMSNorm",
    draft_pattern="kARResidualRMSNorm",
):
    """Warm AOT compile cache: a first run compiled both models (passes built,
    fused ops baked with the pass's ``max_token_num``); then a new process
    loads both graphs from the cache, so no pass is constructed: the worker
    creates the workspace when it loads the models (patch 0002 on), or else
    the target's compiled op creates it lazily with its own tensors."""
    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    # first (cold) run, which filled the cache
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}
    if draft_hidden is not None:
        plans["draft"] = compile_plan(draft_config(cfg), fusion_pass(draft_config(cfg)))
    # second run: new process, graphs come from the AOT cache
    new_process()
    worker_init(cfg)
    results = {"target": forward_all(plans["target"], max_num_batched_tokens, target_pattern)}
    if draft_hidden is not None:
        results["draft"] = forward_all(plans["draft"], max_num_batched_tokens, draft_pattern)
    return {
        "plans": plans,
        "forward": results,
        "workspaces": workspaces(),
        "created": list(state["created"]),
        "kernel_calls": kernel_calls(),
    }


# FlashInfer's validation of a request against a workspace too small for it
_TOO_SMALL = (
    "exceeds workspace max_token_num",  # trtllm
    "buffer size in the given workspace is insufficient",  # mnnvl
)


def _ran_fused(result: dict) -> bool:
    """Every model of ``result["forward"]`` sent some token count to FlashInfer,
    and every fused call matched the unfused reference."""
    for sent in result.get("forward", {}).values():
        fused = [v for v in sent.values() if v.get("fused")]
        if not fused or any(v["max_abs_err"] != 0.0 for v in fused):
            return False
    return True


def check_warm_start(result: dict) -> bool | None:
    """Fixed: both models load and run fused (no error, exact results); the
    bug: FlashInfer's workspace validation rejects the wider model
    (ValueError "exceeds workspace max_token_num" from trtllm, "buffer size
    in the given workspace is insufficient" from MNNVL)."""
    for message in _TOO_SMALL:
        verdict = by_exception(result, "ValueError", message, _ran_fused)
        if verdict is not None:
            return verdict
    return None


def warm_start_capture_order(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    num_warmups=None,
):
    """Warm start (new process, graphs from the AOT cache: no pass is built)
    in vLLM's start order: the profile run at ``max_num_batched_tokens``
    (target, then drafter), then CUDA graph capture of the config's
    ``cudagraph_capture_sizes`` from the largest to the smallest, each size
    (target, then drafter) after ``num_warmups`` eager runs, with
    ``state["capturing"]`` set during the capture (allocation is refused
    there).  ``num_warmups=None``: the config's ``cudagraph_num_of_warmups``
    as ``VllmConfig`` sets it on a platform with static graph support (1
    unless enforce_eager, v0.27.1 ``vllm/config/vllm.py:1432``; the
    CompilationConfig field's default is 0).  The first error stops the
    start; ``at`` says where."""
    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    cc = cfg.compilation_config
    warmups = cc.cudagraph_num_of_warmups if num_warmups is None else num_warmups
    sizes = sorted(cc.cudagraph_capture_sizes or [], reverse=True)
    # the first (cold) run compiled both models and filled the AOT cache
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}
    if draft_hidden is not None:
        dcfg = draft_config(cfg)
        plans["draft"] = compile_plan(dcfg, fusion_pass(dcfg))
    new_process()
    worker_init(cfg)  # the graphs come from the AOT cache: no pass
    steps = [("profile", max_num_batched_tokens)]
    for n in sizes:
        steps += [("warmup", n)] * warmups + [("capture", n)]
    out: dict[str, Any] = {
        "cudagraph_mode": str(cc.cudagraph_mode),
        "config_num_warmups": cc.cudagraph_num_of_warmups,
        "num_warmups": warmups,
        "capture_sizes": {"count": len(sizes), "largest": sizes[0] if sizes else None},
        "fused_ranges": {k: p["fused_ranges"] for k, p in plans.items()},
    }
    calls = {"fused": 0, "unfused": 0}
    first_fused, max_err, at = None, 0.0, None
    try:
        for phase, n in steps:
            for model, plan in plans.items():
                at = f"{phase}:{model}:{n}"
                state["capturing"] = phase == "capture"
                try:
                    res = forward(plan, n)
                finally:
                    state["capturing"] = False
                if res["fused"]:
                    calls["fused"] += 1
                    first_fused = first_fused or at
                    err = res["max_abs_err"]  # None: not computed (numerics off)
                    max_err = None if None in (err, max_err) else max(max_err, err)
                else:
                    calls["unfused"] += 1
    except Exception as e:  # noqa: BLE001  (reported like the harness does)
        out.update(error=type(e).__name__, message=str(e)[:500], at=at)
    out.update(
        calls=calls,
        first_fused=first_fused,
        max_abs_err=max_err,
        attempts_in_capture=state["attempts_in_capture"],
        created=list(state["created"]),
        workspaces=workspaces(),
    )
    return out


_START_BUGS = (
    *(("ValueError", m) for m in _TOO_SMALL),  # a too small workspace
    ("AssertionError", "workspace must be initialized"),  # creation failed
    ("RuntimeError", CAPTURE_REFUSAL),
)


def check_warm_start_capture_order(result: dict) -> bool | None:
    """Fixed: the whole start runs, fused calls among it, all exact, and no
    creation was attempted inside a capture; the bug: the start dies of a
    workspace that is too small or was not created (refused in capture)."""
    if "error" in result:
        bug = any(result["error"] == e and m in result.get("message", "") for e, m in _START_BUGS)
        return False if bug else None
    return (
        result["calls"]["fused"] > 0
        and result["max_abs_err"] == 0.0
        and result["attempts_in_capture"] == 0
    )


def standalone(
    target_hidden=2048,
    draft_hidden=2560,
    tp=4,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    fusion_max_size_mb=None,
    passes_first=False,
):
    """FlashInferAllReduce (VLLM_ALLREDUCE_USE_FLASHINFER=1), constructed with
    the TP group before the models are loaded: target tensors first, then
    the drafter's, at token counts around the limits FlashInferAllReduce may
    accept for each width (each accepted tensor goes to FlashInfer).
    Tensors are CPU tensors presented as CUDA (simulated)."""
    import torch
    import vllm.distributed.parallel_state as ps

    setup(tp, capability, backend)
    cfg = engine_config(
        target_hidden,
        draft_hidden,
        tp,
        max_num_batched_tokens,
        fusion_max_size_mb=fusion_max_size_mb,
    )
    worker_init(cfg, standalone=True)
    comm = ps._TP.device_communicator.fi_ar_comm
    created_at_load = len(state["created"])
    if passes_first:  # a cold start: the profile run compiles before it all-reduces
        fusion_pass(cfg)
        if draft_hidden is not None:
            fusion_pass(draft_config(cfg))

    class _OnDevice(torch.Tensor):
        is_cuda = property(lambda self: True)

    accepted = {}
    for name, h in (("target", target_hidden), ("draft", draft_hidden)):
        if h is None:
            continue
        # probe around the limits: largest accepted token count for this width
        candidates = sorted(
            {1, 2, 64, max_num_batched_tokens}
            | {(tp_budget_elems(cfg) // h) + d for d in (-1, 0, 1)}
            | {(tp_budget_elems(cfg) // target_hidden) + d for d in (-1, 0, 1)}
        )
        accepted[name] = []
        for n in candidates:
            if n < 1 or n > max_num_batched_tokens:
                continue
            t = torch.Tensor._make_subclass(_OnDevice, torch.ones(n, h, dtype=torch.bfloat16))
            if comm.should_use_fi_ar(t):
                comm.all_reduce(t)
                accepted[name].append(n)
    return {
        "accepted": accepted,
        "created_at_load": created_at_load,
        "workspaces": workspaces(),
        "kernel_calls": kernel_calls(),
    }


# standalone(**STANDALONE_SMALL_BUDGET): SM90 TP2, a fusion budget set below
# the default (1 of 64 MiB; the standalone FlashInfer all-reduce of v0.27.x
# bounds its inputs by the default), a cold start: the fusion passes create
# the workspace before the first all-reduce.
STANDALONE_SMALL_BUDGET = {"tp": 2, "fusion_max_size_mb": 1, "passes_first": True}


def check_standalone(result: dict) -> bool | None:
    """Fixed: every input the standalone all-reduce accepts runs in
    FlashInfer; the bug: one it accepts fails FlashInfer's workspace check."""
    if "error" in result:
        message = result.get("message", "")
        bug = result["error"] == "ValueError" and any(m in message for m in _TOO_SMALL)
        return False if bug else None
    return bool(result["accepted"].get("target"))


def fused_ranges(
    target_hidden=2048,
    draft_hidden=2560,
    tp=4,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    spec_method="draft_model",
):
    """Cold start; each model's fused range against its own token limit and
    the fusion's byte budget.  A draft model is compiled with its own config
    (DraftModelProposer); an EAGLE/MTP head (``spec_method`` other than
    draft_model) with the target's: its plan is the target config's pass,
    applied to tensors of the head's width (SIMULATED: no head is built)."""
    setup(tp, capability, backend)
    new_process()
    cfg = engine_config(
        target_hidden, draft_hidden, tp, max_num_batched_tokens, spec_method=spec_method
    )
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}
    if spec_method == "draft_model":
        dcfg = draft_config(cfg)
        plans["draft"] = compile_plan(dcfg, fusion_pass(dcfg))
    else:
        plans["draft"] = {**compile_plan(cfg, fusion_pass(cfg)), "hidden": draft_hidden}
    budget = tp_budget_elems(cfg)
    models = {}
    for name, plan in plans.items():
        top = max((r[1] for r in plan["fused_ranges"]), default=0)
        models[name] = {
            "fused_up_to": top,
            "own_limit": min(budget // plan["hidden"], max_num_batched_tokens),
            "over_budget": top * plan["hidden"] > budget,
        }
    return {
        "method": spec_method,
        "models": models,
        "workspace": workspaces()["_fi_ar_workspace"],
        "forward": {n: forward_all(p, max_num_batched_tokens) for n, p in plans.items()},
        "kernel_calls": kernel_calls(),
    }


def check_fused_ranges(result: dict) -> bool | None:
    """Fixed: no model fuses past the byte budget, each fuses and runs exact,
    and with a draft model each fuses up to its own token limit; the bug: a
    model over the budget, or one short of its own limit (or unfused)."""
    if "error" in result:
        return None
    models = result["models"].values()
    if any(m["over_budget"] for m in models):
        return False
    if result["method"] == "draft_model":
        if any(m["fused_up_to"] < m["own_limit"] for m in models):
            return False
    elif any(not m["fused_up_to"] for m in models):
        return False
    return _ran_fused(result)


def tp_budget_elems(cfg) -> int:
    pc = cfg.compilation_config.pass_config
    return pc.flashinfer_max_size(cfg.parallel_config.tensor_parallel_size) // 2


def _fused_call(plan, n=1) -> dict:
    """One call of a compiled graph's fused op; an exception is reported."""
    try:
        return forward(plan, n)
    except Exception as e:  # noqa: BLE001
        return {"error": type(e).__name__, "message": str(e)[:300]}


def _ranks(fiar) -> dict:
    return {
        "attempts": state["attempts"],
        "workspace": fiar._fi_ar_workspace is not None,
        "peer_workspace": state["peer_has_workspace"],
    }


def creation_failure(where="local", tp=2, capability=90, backend="trtllm"):
    """Workspace creation fails on its first attempt only: on this rank (a
    simulated out-of-memory raised by FlashInfer's constructor on this rank
    only; the simulation has no handle exchange, so this is a failure after
    it: one inside it, with the peers still waiting there, is what patch
    0004 says it does not cover) or on a peer (its first attempt fails; this
    rank's succeeds).  Cold start: the worker loads
    the models, then the target's and the drafter's passes are built.  Warm
    start (compiled graphs from the cache): the worker loads the models, then
    the fused op is called three times.  Reports per start this rank's
    creation attempts and whether this rank and the peer end with a
    workspace.  A correct tree attempts creation once per process and every
    rank ends in the same state."""
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    setup(tp, capability, backend)
    cfg = engine_config(2048, 2560, tp, 8192)
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}  # a good earlier run
    fails = "local_fails" if where == "local" else "peer_fails"
    out = {}
    new_process()
    state[fails] = 1
    worker_init(cfg)
    passes = [fusion_pass(cfg), fusion_pass(draft_config(cfg))]
    out["cold"] = {**_ranks(fiar), "fusion_enabled": [not p.disabled for p in passes]}
    new_process()
    state[fails] = 1
    worker_init(cfg)
    calls = [_fused_call(plans["target"]) for _ in range(3)]
    out["warm"] = {**_ranks(fiar), "calls": calls}
    return out


def check_creation_failure(result: dict) -> bool | None:
    """Fixed: in both starts one attempt and every rank (this one and the
    peer) ends without a workspace; the bug: creation retried, or the ranks
    end in different states."""
    if "error" in result or not all(k in result for k in ("cold", "warm")):
        return None
    starts = [result["cold"], result["warm"]]
    if any(s["attempts"] > 1 or s["workspace"] != s["peer_workspace"] for s in starts):
        return False
    if all(s["attempts"] == 1 and not s["workspace"] for s in starts):
        return True
    return None


def capture_first_use(tp=2, capability=90, backend="trtllm"):
    """Warm start whose first fused call happens while a CUDA graph is being
    captured (``state["capturing"]``, where the simulated allocation is
    refused).  Creating there would allocate and run a collective inside the
    capture."""
    setup(tp, capability, backend)
    cfg = engine_config(2048, 2560, tp, 8192)
    worker_init(cfg)
    plan = compile_plan(cfg, fusion_pass(cfg))
    new_process()
    worker_init(cfg)
    collectives = state["collectives"]
    state["capturing"] = True
    try:
        call = _fused_call(plan)
    finally:
        state["capturing"] = False
    return {
        "call": call,
        "attempts_in_capture": state["attempts_in_capture"],
        "collectives_in_capture": state["collectives"] - collectives,
    }


def drafter_pass_collected(tp=2, capability=90, backend="trtllm"):
    """Cold start, then the drafter's pass object is garbage-collected (its
    compiled graphs are done with it) while the target's graphs keep running.
    The workspace they use must be neither destroyed nor re-created."""
    import gc

    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    setup(tp, capability, backend)
    cfg = engine_config(2048, 2560, tp, 8192)
    worker_init(cfg)
    target_plan = compile_plan(cfg, fusion_pass(cfg))
    draft_pass = fusion_pass(draft_config(cfg))
    state["passes"].remove(draft_pass)
    del draft_pass
    gc.collect()
    alive = fiar._fi_ar_workspace is not None
    forward = forward_all(target_plan, 8192)
    return {
        "destroyed": len(state["destroyed"]),
        "alive_after_gc": alive,
        "created": list(state["created"]),
        "forward": {"target": forward},
        "kernel_calls": kernel_calls(),
    }


def check_drafter_pass_collected(result: dict) -> bool | None:
    """Fixed: the workspace outlives the drafter's pass (not destroyed, not
    created again) and the target's calls run fused and exact; the bug: the
    pass's collection destroyed it (and the next call made another)."""
    if "error" in result:
        return None
    if result["destroyed"] or not result["alive_after_gc"] or len(result["created"]) != 1:
        return False
    return _ran_fused(result)


def two_engines(first_hidden=2048, second_hidden=5120, tp=2, first_fails=False, teardown=True):
    """Two engines one after the other in one process (external_launcher /
    torchrun / RL loops): engine 1 runs, is torn down (the TP group's
    communicator is destroyed) or keeps the model-parallel groups
    (``teardown=False``), and engine 2, wider, starts.  Engine 1's pass
    objects are still referenced (nothing guarantees they are collected
    before engine 2 compiles).  With ``first_fails`` engine 1's first
    workspace creation fails on this rank."""
    setup(tp, 90, "trtllm")
    cfg1 = engine_config(first_hidden, None, tp, 8192)
    state["local_fails"] = 1 if first_fails else 0
    worker_init(cfg1)
    plan1 = compile_plan(cfg1, fusion_pass(cfg1))
    first = forward_all(plan1, 8192) if plan1["fused_ranges"] else {}
    first_attempts = state["attempts"]
    if teardown:
        teardown_tp_group()
    destroyed = len(state["destroyed"])
    state["created"].clear()
    state["kernel_calls"].clear()
    cfg2 = engine_config(second_hidden, None, tp, 8192)
    worker_init(cfg2)
    plan2 = compile_plan(cfg2, fusion_pass(cfg2))
    return {
        "first": first,
        "first_attempts": first_attempts,
        "first_fused": bool(plan1["fused_ranges"]),
        "destroyed_at_teardown": destroyed,
        "forward": {"target": forward_all(plan2, 8192)},
        "plan": plan2,
        "created": list(state["created"]),
        "workspaces": workspaces(),
        "kernel_calls": kernel_calls(),
    }


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


# --------------------------------------------------------------------------
# property: every shape the compiled graphs may send fits the workspace
# --------------------------------------------------------------------------
HIDDEN_SIZES = [1024, 2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192]


def sent_sizes(plan, tp, elem=2) -> list[int]:
    """Token counts worth checking for a model's fused ranges: 1, each fused
    range end and, for MNNVL's non-monotonic need, its one-shot boundary."""
    from flashinfer.comm.trtllm_mnnvl_ar import MNNVL_ONE_SHOT_THRESHOLD

    if not plan["fused_ranges"]:
        return []
    top = plan["fused_ranges"][-1][1]
    n1 = MNNVL_ONE_SHOT_THRESHOLD // (tp * elem * plan["hidden"])
    sizes = {1, *(r[1] for r in plan["fused_ranges"]), n1, n1 + 1}
    return sorted(n for n in sizes if 1 <= n <= top)


def check_case(
    target_hidden, draft_hidden, tp, capability, max_num_batched_tokens, backend
) -> dict:
    """Cold and warm order for one configuration; list what does not fit."""
    import torch
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    setup(tp, capability, backend)
    new_process()
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    configs = {"target": cfg}
    if draft_hidden is not None:
        configs["draft"] = draft_config(cfg)
    bad: list[str] = []
    # cold: passes built target first, then drafter
    worker_init(cfg)
    plans = {k: compile_plan(c, fusion_pass(c)) for k, c in configs.items()}
    lost = [k for k, p in plans.items() if not p["fused_ranges"]]

    def check(order):
        ws = fiar._fi_ar_workspace
        for name, plan in plans.items():
            for n in sent_sizes(plan, tp):
                if ws is None or not fits(ws, n, plan["hidden"], tp, torch.bfloat16):
                    bad.append(f"{order}:{name}:{n}x{plan['hidden']}")

    check("cold")
    # warm: no pass; the worker (with the series) or else the target's
    # compiled op creates the workspace
    new_process()
    worker_init(cfg)
    first = next((p for p in plans.values() if p["fused_ranges"]), None)
    if first is not None:
        try:
            forward(first, 1)
        except Exception as e:  # noqa: BLE001
            bad.append(f"warm:create:{type(e).__name__}")
        check("warm")
    bytes_ = workspace_bytes(fiar._fi_ar_workspace) if fiar._fi_ar_workspace else 0
    return {"bad": bad, "fusion_lost": lost, "bytes": bytes_}


def property_fits(max_examples: int = 60) -> dict:
    """Hypothesis over hidden sizes (draft: none / same / any), TP sizes,
    device capabilities, token limits and backends.  Deterministic
    (derandomized), so both trees see the same cases.  Never raises: returns
    how many cases send a shape the workspace cannot hold."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    setup(2, 90, "trtllm")
    cases: list[dict] = []

    @settings(
        max_examples=max_examples,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        target_hidden=st.sampled_from(HIDDEN_SIZES),
        draft=st.one_of(st.none(), st.just("same"), st.sampled_from(HIDDEN_SIZES)),
        tp=st.sampled_from([2, 4, 8]),
        capability=st.sampled_from([90, 100, 103]),
        max_num_batched_tokens=st.sampled_from([256, 1024, 2048, 8192, 16384]),
        backend=st.sampled_from(["trtllm", "mnnvl"]),
    )
    def run(target_hidden, draft, tp, capability, max_num_batched_tokens, backend):
        draft_hidden = target_hidden if draft == "same" else draft
        args = dict(
            target_hidden=target_hidden,
            draft_hidden=draft_hidden,
            tp=tp,
            capability=capability,
            max_num_batched_tokens=max_num_batched_tokens,
            backend=backend,
        )
        try:
            res = check_case(**args)
        except Exception as e:  # noqa: BLE001
            res = {"bad": [f"error:{type(e).__name__}:{e}"[:200]], "fusion_lost": [], "bytes": 0}
        cases.append({**args, **res})

    run()
    failing = [c for c in cases if c["bad"]]
    return {
        "cases": len(cases),
        "failing": len(failing),
        "failing_wider_draft": sum(
            1 for c in failing if c["draft_hidden"] and c["draft_hidden"] > c["target_hidden"]
        ),
        "fusion_lost": sum(1 for c in cases if c["fusion_lost"]),
        "failing_examples": failing[:8],
        "by_backend": {
            b: sum(1 for c in failing if c["backend"] == b) for b in ("trtllm", "mnnvl")
        },
    }
