# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A's seed starts (scenarios of tpfix.replay.bug_a, which re-exports
them and whose docstring says what is REAL and what SIMULATED): the cold
start (``cold_start``), the warm start from the AOT compile cache
(``warm_start``) and the warm start in vLLM's start order, CUDA graph
capture included (``warm_start_capture_order``), with their verdicts; and
what the other bug-A verdicts share: ``TOO_SMALL`` (FlashInfer's messages
for a workspace too small for a request) and ``ran_fused``.
"""

from __future__ import annotations

from typing import Any

from tpfix.replay.device import CAPTURE_REFUSAL, new_process, setup, state
from tpfix.replay.engine import (
    compile_plan,
    compile_plans,
    draft_config,
    engine_config,
    forward,
    forward_all,
    fusion_covers_budget,
    fusion_pass,
    kernel_calls,
    worker_init,
    workspaces,
)
from tpfix.replay.verdict import by_exception


def cold_start(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    pattern="kARResidualRMSNorm",
    fusion_max_size_mb=None,
):
    """Seed config, empty compile cache: the worker starts, the compiler builds
    the target's fusion pass, then the drafter's, then the profile run sends
    ``max_num_batched_tokens`` tokens through target and drafter.
    ``fusion_max_size_mb``: pass_config.fi_allreduce_fusion_max_size_mb
    (None: vLLM's default for the TP size), here and in the warm starts."""
    setup(tp, capability, backend)
    cfg = engine_config(
        target_hidden,
        draft_hidden,
        tp,
        max_num_batched_tokens,
        fusion_max_size_mb=fusion_max_size_mb,
    )
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
    standalone_first=False,
):
    """Warm AOT compile cache: a first run compiled both models (passes built,
    fused ops baked with the pass's ``max_token_num``); then a new process
    loads both graphs from the cache, so no pass is constructed: the worker
    creates the workspace when it loads the models (patch 0002 on), or else
    the target's compiled op creates it lazily with its own tensors.
    ``standalone_first``: the standalone FlashInfer all-reduce is on
    (VLLM_ALLREDUCE_USE_FLASHINFER=1) and an all-reduce outside the fused
    graphs (one token of the target's width, a CPU tensor presented as CUDA:
    SIMULATED) runs before any fused op, so that it creates the workspace."""
    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    # first (cold) run, which filled the cache
    worker_init(cfg)
    plans = compile_plans(cfg, draft_hidden is not None)
    # second run: new process, graphs come from the AOT cache
    new_process()
    worker_init(cfg, standalone=standalone_first)
    if standalone_first:
        import torch
        import vllm.distributed.parallel_state as ps

        class _OnDevice(torch.Tensor):
            is_cuda = property(lambda self: True)

        comm = ps._TP.device_communicator.fi_ar_comm
        t = torch.Tensor._make_subclass(
            _OnDevice, torch.ones(1, target_hidden, dtype=torch.bfloat16)
        )
        assert comm.should_use_fi_ar(t), "the standalone all-reduce declined"
        comm.all_reduce(t)
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
TOO_SMALL = (
    "exceeds workspace max_token_num",  # trtllm
    "buffer size in the given workspace is insufficient",  # mnnvl
)


def ran_fused(result: dict) -> bool:
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
    for message in TOO_SMALL:
        verdict = by_exception(result, "ValueError", message, ran_fused)
        if verdict is not None:
            return verdict
    return None


def check_cold_start(result: dict) -> bool | None:
    """Fixed: both models run fused (no error, exact results); the bug:
    FlashInfer's workspace validation rejects a model's fused problem (a
    narrower draft's where the budget limits the tokens)."""
    return check_warm_start(result)


def warm_start_capture_order(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    num_warmups=None,
    fusion_max_size_mb=None,
    cudagraph_mode=None,
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
    CompilationConfig field's default is 0).  ``cudagraph_mode``: a
    ``CUDAGraphMode`` name (None: vLLM's default); with ``NONE`` vLLM
    captures nothing, so the start is the profile run.  The first error
    stops the start; ``at`` says where."""
    setup(tp, capability, backend)
    cfg = engine_config(
        target_hidden,
        draft_hidden,
        tp,
        max_num_batched_tokens,
        fusion_max_size_mb=fusion_max_size_mb,
        cudagraph_mode=cudagraph_mode,
    )
    cc = cfg.compilation_config
    warmups = cc.cudagraph_num_of_warmups if num_warmups is None else num_warmups
    sizes = sorted(cc.cudagraph_capture_sizes or [], reverse=True)
    # the first (cold) run compiled both models and filled the AOT cache
    worker_init(cfg)
    plans = compile_plans(cfg, draft_hidden is not None)
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
    *(("ValueError", m) for m in TOO_SMALL),  # a too small workspace
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
