# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A's fusion byte budget (scenarios of tpfix.replay.bug_a, which
re-exports them and whose docstring says what is REAL and what SIMULATED):
the standalone FlashInfer all-reduce's accepted inputs (``standalone``) and
each model's fused range against its own token limit and the budget
(``fused_ranges``), with their verdicts; ``tp_budget_elems``: the budget in
elements.
"""

from __future__ import annotations

from tpfix.replay.bug_a_starts import TOO_SMALL, ran_fused
from tpfix.replay.device import new_process, setup, state
from tpfix.replay.engine import (
    compile_plan,
    compile_plans,
    draft_config,
    engine_config,
    forward_all,
    fusion_pass,
    kernel_calls,
    worker_init,
    workspaces,
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


def check_standalone(result: dict) -> bool | None:
    """Fixed: every input the standalone all-reduce accepts runs in
    FlashInfer; the bug: one it accepts fails FlashInfer's workspace check."""
    if "error" in result:
        message = result.get("message", "")
        bug = result["error"] == "ValueError" and any(m in message for m in TOO_SMALL)
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
    plans = compile_plans(cfg, spec_method == "draft_model")
    if spec_method != "draft_model":
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
    return ran_fused(result)


def tp_budget_elems(cfg) -> int:
    pc = cfg.compilation_config.pass_config
    return pc.flashinfer_max_size(cfg.parallel_config.tensor_parallel_size) // 2
