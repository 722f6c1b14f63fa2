# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A's workspace lifetime (scenarios of tpfix.replay.bug_a, which
re-exports them and whose docstring says what is REAL and what SIMULATED):
creation failing on this rank or a peer (``creation_failure``), the first
creation inside a CUDA graph capture (``capture_first_use``), the drafter's
pass garbage-collected (``drafter_pass_collected``) and two engines one
after the other in one process (``two_engines``), with their verdicts.
"""

from __future__ import annotations

from tpfix.replay.bug_a_starts import ran_fused
from tpfix.replay.device import new_process, setup, state
from tpfix.replay.engine import (
    compile_plan,
    draft_config,
    engine_config,
    forward,
    forward_all,
    fusion_pass,
    kernel_calls,
    teardown_tp_group,
    worker_init,
    workspaces,
)


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
    return ran_fused(result)


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
