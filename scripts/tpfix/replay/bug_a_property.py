# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A's property (a scenario of tpfix.replay.bug_a, which re-exports
``property_fits`` and whose docstring says what is REAL and what
SIMULATED): every shape the compiled graphs may send fits the workspace,
over hidden sizes, TP sizes, capabilities, token limits and backends
(Hypothesis); ``check_case`` checks one configuration, cold and warm.
"""

from __future__ import annotations

from tpfix.replay.device import new_process, setup
from tpfix.replay.engine import (
    compile_plan,
    draft_config,
    engine_config,
    fits,
    forward,
    fusion_pass,
    worker_init,
)
from tpfix.replay.flashinfer_sim import workspace_bytes

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
