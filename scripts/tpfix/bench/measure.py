# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The benchmarks' measurements inside a vLLM tree: functions that
``harness.run_scenario(tree, "tpfix.bench.measure:<function>", ...)`` runs
in a fresh interpreter on the tree under test, on the simulated device of
``tpfix.replay.device`` (its docstring says what is simulated; everything
vLLM does is the tree's real code).  Their drivers, which print the tables:
``bench`` and ``min_need``: bench/workspace.py; ``sweep``:
bench/sweep_workspace.py; ``op_overhead_ab``: bench/fused_op.py; ``bench_table``
(on bug_b's cases, recorder.setup_recording()): bench/oneshot.py.
"""

from __future__ import annotations

import os
from typing import Any

from tpfix.replay.bug_b import run_case, torch_dtype, value_ranges
from tpfix.replay.device import MiB, new_process, setup, state
from tpfix.replay.engine import (
    compile_plan,
    draft_config,
    engine_config,
    fits,
    forward,
    fusion_pass,
    worker_init,
)
from tpfix.replay.flashinfer_sim import make_workspace, trtllm_sizes, workspace_bytes
from tpfix.replay.recorder import setup_recording


# --------------------------------------------------------------------------
# bytes per rank (bench/workspace.py)
# --------------------------------------------------------------------------
def _all_workspace_bytes() -> int:
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    seen, total = set(), 0
    for ws in (fiar._fi_ar_workspace, fiar._fi_ar_quant_workspace):
        if ws is not None and id(ws) not in seen:
            seen.add(id(ws))
            total += workspace_bytes(ws)
    return total


def bench(configs: list[dict]) -> list[dict]:
    """Per config: bytes per rank this tree allocates in cold order (the
    worker's load, then the target's pass, then the drafter's) and warm
    order (AOT cache, no pass: the worker's load, then the target's fused
    op), and the compile ranges each model fuses (cold plans)."""
    out = []
    for c in configs:
        row: dict[str, Any] = {"config": c}
        try:
            setup(c["tp"], c["capability"], c["backend"])
            new_process()
            cfg = engine_config(
                c["target_hidden"], c["draft_hidden"], c["tp"], c["max_num_batched_tokens"]
            )
            configs_ = {"target": cfg}
            if c["draft_hidden"] is not None:
                configs_["draft"] = draft_config(cfg)
            worker_init(cfg)
            plans = {k: compile_plan(v, fusion_pass(v)) for k, v in configs_.items()}
            row["plans"] = plans
            row["cold_bytes"] = _all_workspace_bytes()
            new_process()
            worker_init(cfg)
            first = next((p for p in plans.values() if p["fused_ranges"]), None)
            if first is not None:
                try:
                    forward(first, 1)
                except Exception as e:  # noqa: BLE001
                    row["warm_error"] = type(e).__name__
            row["warm_bytes"] = _all_workspace_bytes()
            row["budget"] = cfg.compilation_config.pass_config.flashinfer_max_size(c["tp"])
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
        finally:
            new_process()
        out.append(row)
    return out


def _min_need(c: dict, budget: int | None) -> int:
    """Least bytes per rank FlashInfer needs for every admitted shape: each
    model up to its own token limit (the pass's, at its own width), in one
    workspace as wide as the widest model.  trtllm: FlashInfer checks
    token * hidden elements; mnnvl: ``get_required_buffer_size_bytes`` with
    FlashInfer's AUTO choice for every request (what v0.27.1 and the
    series request on MNNVL)."""
    import torch

    if budget is None:
        return 0
    widths = [c["target_hidden"]] + ([c["draft_hidden"]] if c["draft_hidden"] else [])
    dtype, tp = torch.bfloat16, c["tp"]
    widest = max(widths)
    limits = {h: min(budget // (h * 2), c["max_num_batched_tokens"]) for h in widths}
    if min(limits.values()) < 1:
        return 0
    if c["backend"] == "trtllm":
        rows = -(-max(n * h for h, n in limits.items()) // widest)
        m = trtllm_sizes(tp, rows, widest, dtype)
        r16 = lambda n: (n + 15) // 16 * 16  # noqa: E731
        return r16(m["buffer_size"]) + r16(m["flag_size"]) + r16(m["lamport_buffer_size"])
    from flashinfer.comm.trtllm_mnnvl_ar import (
        MNNVLAllreduceFusionStrategy,
        MNNVLAllReduceFusionWorkspace,
    )

    need = max(
        MNNVLAllReduceFusionWorkspace.get_required_buffer_size_bytes(
            tp, n, h, dtype, MNNVLAllreduceFusionStrategy.AUTO
        )
        for h, limit in limits.items()
        for n in range(1, limit + 1)
    )
    return need // 16 * 16 * MNNVLAllReduceFusionWorkspace.NUM_LAMPORT_BUFFERS


def min_need(configs: list[dict], budgets: list) -> list[int]:
    """_min_need for each config (bench/workspace.py): FlashInfer's own sizing."""
    return [_min_need(c, b) for c, b in zip(configs, budgets, strict=True)]


# --------------------------------------------------------------------------
# sweep (scripts/tpfix/bench/sweep_workspace.py): many configurations, one interpreter
# --------------------------------------------------------------------------
def _samples(top: int, tp: int, widths, elem=2) -> list[int]:
    """Token counts worth checking up to ``top``: the ends, around the TP
    split and around every width's MNNVL one-shot boundary."""
    from flashinfer.comm.trtllm_mnnvl_ar import MNNVL_ONE_SHOT_THRESHOLD

    ns = {1, 2, tp - 1, tp, tp + 1, top - 1, top}
    for h in widths:
        b = MNNVL_ONE_SHOT_THRESHOLD // (tp * elem * h)
        ns |= {b - 1, b, b + 1, b + 2}
    return sorted(n for n in ns if 1 <= n <= top)


class _Probe:
    """What FlashInferAllReduce.should_use_fi_ar reads of an input tensor."""

    def __init__(self, n, h, dtype):
        self.shape, self.dtype, self.is_cuda = (n, h), dtype, True
        self.nbytes = n * h * dtype.itemsize

    def is_contiguous(self):
        return True


def sweep(configs: list[dict]) -> list[dict]:
    """Per configuration (target/draft width, TP, SM, backend, token limit,
    standalone all-reduce on/off), in cold and warm creation order: does
    every request the engine makes fit the workspace it gets (FlashInfer's
    own validators)?  Also: each model's largest fused token count and the
    workspace bytes per rank.  Everything vLLM does is the tree's real code;
    SIMULATED as in tpfix.replay.device's docstring, and here also: pattern
    registration of the fusion pass is skipped (it does not size anything),
    and standalone inputs are shape probes (no tensor data)."""
    setup(2, 90, "trtllm")  # before importing vLLM's compilation modules
    import torch
    import vllm.compilation.passes.fusion.allreduce_rms_fusion as arf
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar
    import vllm.distributed.parallel_state as ps

    # register_patterns() ends by enabling the pass; keep only that
    arf.AllReduceFusionPass.register_patterns = lambda self: setattr(self, "disabled", False)
    out = []
    engines: dict[tuple, Any] = {}
    for c in configs:
        t, d, tp, cap, b = (c[k] for k in ("target", "draft", "tp", "capability", "tokens"))
        os.environ["VLLM_ALLREDUCE_USE_FLASHINFER"] = "1" if c["standalone"] else "0"
        setup(tp, cap, c["backend"])
        row: dict[str, Any] = {"config": c}
        key = (t, d, tp, cap, b)
        if key not in engines:
            cfg = engine_config(t, d, tp, b)
            engines[key] = (cfg, draft_config(cfg) if d is not None else None)
        cfg, dcfg = engines[key]
        models = {"target": (cfg, t)}
        if dcfg is not None:
            models["draft"] = (dcfg, d)
        widths = sorted({h for _, h in models.values()})
        plans: dict[str, dict] = {}
        for order in ("cold", "warm"):
            new_process()
            bad: list[str] = []
            try:
                worker_init(cfg, standalone=c["standalone"])
                comm = ps._TP.device_communicator.fi_ar_comm
                if comm is not None and order == "warm":  # a standalone all-reduce first
                    comm.should_use_fi_ar(_Probe(1, t, torch.bfloat16))
                if order == "cold":
                    plans = {k: compile_plan(mc, fusion_pass(mc)) for k, (mc, _) in models.items()}
                elif plans["target"]["fused_ranges"]:
                    forward(plans["target"], 1)  # the target's compiled op
                ws = fiar._fi_ar_workspace
                for k, (_, h) in models.items():
                    fused = plans[k]["fused_ranges"]
                    top = fused[-1][1] if fused else 0
                    for n in _samples(top, tp, widths):
                        if ws is None or not fits(ws, n, h, tp, torch.bfloat16):
                            bad.append(f"{k}:{n}x{h}")
                    for n in _samples(b, tp, widths) if comm is not None else []:
                        probe = _Probe(n, h, torch.bfloat16)
                        if comm.should_use_fi_ar(probe) and not fits(
                            fiar._fi_ar_workspace, n, h, tp, torch.bfloat16, standalone=True
                        ):
                            bad.append(f"standalone:{n}x{h}")
            except Exception as e:  # noqa: BLE001
                bad.append(f"{type(e).__name__}: {str(e)[:120]}")
            row[order] = {"bad": bad[:3], "crash": bool(bad), "bytes": _all_workspace_bytes()}
        row["fused_top"] = {
            k: (p["fused_ranges"][-1][1] if p["fused_ranges"] else 0) for k, p in plans.items()
        }
        row["min_bytes"] = _min_bytes(models, plans, widths, tp, c["backend"])
        out.append(row)
    return out


def _min_bytes(models, plans, widths, tp, backend) -> int | None:
    """The smallest FlashInfer workspace (FlashInfer's real workspace classes
    and validators, as wide as the widest model) that holds every model's
    requests up to its fused range, with the strategy this tree requests."""
    import torch

    need = []
    for k, (_, h) in models.items():
        fused = plans[k]["fused_ranges"]
        if fused:
            need += [(n, h) for n in _samples(fused[-1][1], tp, widths)]
    if not need:
        return None
    hidden = max(widths)
    lo, hi = 1, max(-(-n * h // hidden) for n, h in need) * 2 + tp
    while lo < hi:
        mid = (lo + hi) // 2
        ws = make_workspace(backend, tp, 0, mid, hidden, torch.bfloat16)
        state["created"].pop()
        if all(fits(ws, n, h, tp, torch.bfloat16) for n, h in need):
            hi = mid
        else:
            lo = mid + 1
    ws = make_workspace(backend, tp, 0, lo, hidden, torch.bfloat16)
    state["created"].pop()
    return workspace_bytes(ws)


# --------------------------------------------------------------------------
# measurement (scripts/tpfix/bench/fused_op.py): the fused op's own Python cost
# --------------------------------------------------------------------------
def _stock_op(stock_file: str, namespace: dict):
    """The ``call_trtllm_fused_allreduce_norm`` of ``stock_file`` (the stock
    tree's fusion module), compiled in ``namespace`` (a copy of the patched
    module's globals: the op's callees, which the series leaves unchanged)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(stock_file).read_text(), stock_file)
    (fn,) = (
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "call_trtllm_fused_allreduce_norm"
    )
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(module, stock_file, "exec"), namespace)
    return namespace[fn.name]


def op_overhead_ab(
    stock_file: str, backend="trtllm", calls=20000, rounds=21, num_tokens=8, hidden=2048
) -> dict:
    """Seconds per call of the stock and the patched op body side by side in
    this one interpreter (the patched tree's), rounds alternating which runs
    first: the stock ``call_trtllm_fused_allreduce_norm`` (``_stock_op``) and
    this tree's, on the same simulated workspace, the same tensors and the
    kwargs each one's pass bakes (the stock op without the series' added
    parameters).  FlashInfer's ``allreduce_fusion`` is a no-op, so that only
    vLLM's code is timed; the workspace is the engine's (simulated as in the
    module docstring).
    Per op: the best round and the median round; the added cost: the median
    of the per-round differences."""
    import inspect
    import statistics
    import time

    import torch

    setup(2, 90, backend)
    import vllm.compilation.passes.fusion.allreduce_rms_fusion as arf

    cfg = engine_config(hidden, None, 2, 8192)
    worker_init(cfg)
    plan = compile_plan(cfg, fusion_pass(cfg))
    arf.flashinfer_comm.allreduce_fusion = lambda **kwargs: None
    x = torch.zeros(num_tokens, hidden, dtype=torch.bfloat16)
    res, gamma = torch.zeros_like(x), torch.ones(hidden, dtype=torch.bfloat16)
    code = arf.flashinfer_comm.AllReduceFusionPattern.kARResidualRMSNorm
    common = dict(allreduce_in=x, residual=res, rms_gamma=gamma, rms_eps=1e-6, pattern_code=code)
    ops = {"patched": arf.call_trtllm_fused_allreduce_norm}
    ops["stock"] = _stock_op(stock_file, dict(vars(arf)))
    kwargs = {}
    for name, op in ops.items():
        accepted = inspect.signature(op).parameters
        kwargs[name] = {**common, **{k: v for k, v in plan["op_kwargs"].items() if k in accepted}}
        op(**kwargs[name])  # warm: the workspace exists, caches are filled
    times: dict[str, list[float]] = {"stock": [], "patched": []}
    for r in range(rounds):
        for name in ("stock", "patched") if r % 2 == 0 else ("patched", "stock"):
            op, kw = ops[name], kwargs[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                op(**kw)
            times[name].append((time.perf_counter() - t0) / calls)
    added = [p - s for s, p in zip(times["stock"], times["patched"], strict=True)]
    return {
        "backend": backend,
        "calls": calls,
        "rounds": rounds,
        "stock_kwargs": sorted(set(kwargs["stock"]) - set(common)),
        "patched_kwargs": sorted(set(kwargs["patched"]) - set(common)),
        **{f"{k}_best": min(v) for k, v in times.items()},
        **{f"{k}_median": statistics.median(v) for k, v in times.items()},
        "added_median": statistics.median(added),
    }


# --------------------------------------------------------------------------
# one-shot strategy and memory per token count (bench/oneshot.py)
# --------------------------------------------------------------------------
def bench_table(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config and backend: workspace bytes per rank, the strategy of every
    token count as shipped, and whether the tree's one-shot policy fits."""
    st = setup_recording()
    fi_mnnvl, arf = st["fi_mnnvl"], st["arf"]
    workspace_cls = fi_mnnvl.MNNVLAllReduceFusionWorkspace
    strategy = fi_mnnvl.MNNVLAllreduceFusionStrategy
    keys = (
        "backend",
        "capability",
        "tp",
        "widths",
        "dtype",
        "limit",
        "budget_mb",
        "fusion",
        "max_token_num",
        "workspace_bytes_per_rank",
        "mnnvl_buffer_size_bytes",
        "oneshot_tokens",
        "twoshot_tokens",
        "failures",
        "unfused",
    )
    rows = []
    for cfg in configs:
        for backend in ("mnnvl", "trtllm"):
            row = {k: v for k, v in run_case(backend, **cfg).items() if k in keys}
            policy = run_case(backend, vllm_table_on_mnnvl=True, max_failures=1 << 30, **cfg)
            row["policy_failures"] = policy.get("failures")
            row["policy_failure_tokens"] = value_ranges(
                [f["num_tokens"] for f in policy.get("failure_examples", [])]
            )
            if backend == "mnnvl" and row.get("max_token_num"):
                # Rejected alternative: an MNNVL buffer sized for the one-shot
                # range of vLLM's TRT-LLM table (FlashInfer's sizing formula).
                tdtype = torch_dtype(cfg["dtype"])
                h, m, tp = max(cfg["widths"]), max(row["max_token_num"].values()), cfg["tp"]
                table_bytes = _vllm_trtllm_table_oneshot_bytes(arf, cfg["capability"], tp)
                if table_bytes is not None:
                    n1 = min(int(table_bytes) // (tp * h * tdtype.itemsize), m)
                    buf = max(
                        workspace_cls.get_required_buffer_size_bytes(
                            tp, n1, h, tdtype, strategy.ONESHOT
                        ),
                        workspace_cls.get_required_buffer_size_bytes(
                            tp, m, h, tdtype, strategy.TWOSHOT
                        ),
                    )
                    row["alt_vllm_table_oneshot_tokens"] = n1
                    row["alt_vllm_table_bytes_per_rank"] = buf * workspace_cls.NUM_LAMPORT_BUFFERS
            rows.append(row)
    return rows


def _vllm_trtllm_table_oneshot_bytes(arf, capability: int, tp: int):
    """The tuned (TRT-LLM) one-shot limit of the tree's vLLM, in one-shot bytes."""
    if hasattr(arf, "_FI_TRTLLM_ONE_SHOT_MAX_BYTES_MB"):
        mb = arf._FI_TRTLLM_ONE_SHOT_MAX_BYTES_MB.get(capability, {}).get(tp)
        return None if mb is None else mb * MiB
    mb = arf._FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB.get(capability, {}).get(tp)
    return None if mb is None else mb * MiB * tp
