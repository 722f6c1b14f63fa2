# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Engine drivers of the replays: the REAL vLLM code of the tree under test,
driven the way an engine start drives it, on the simulated device of
``tpfix.replay.device`` (``device.setup()`` must have run).

REAL: ``ModelConfig`` (from local ``config.json`` files, no weights),
``SpeculativeConfig``, ``VllmConfig.__post_init__``, the drafter's
configuration via ``DraftModelProposer._create_draft_vllm_config``, the
worker's ``init_worker_distributed_environment`` and ``Worker.load_model``,
``AllReduceFusionPass``, the fused custom op
``call_trtllm_fused_allreduce_norm``, ``CudaCommunicator.destroy()``.
SIMULATED here (beyond the device): the model runner (``load_models``:
loads nothing, its model is ``model_stand_in()``), a model loaded from the
AOT compile cache (``forward`` calls the fused op with the arguments a cold
run's pass baked into it, without a pass).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import types
from typing import Any

from tpfix.replay.device import FakeTPGroup, node_count, state
from tpfix.replay.flashinfer_sim import numerics, reference_kernel, workspace_bytes

_MODEL_DIR = os.path.join(tempfile.gettempdir(), f"bug_a_models_{os.getuid()}")


def _model_dir(hidden: int) -> str:
    """A local Qwen3-style config.json with the given hidden size (no weights)."""
    d = os.path.join(_MODEL_DIR, f"qwen3_h{hidden}")
    if not os.path.exists(os.path.join(d, "config.json")):
        os.makedirs(d, exist_ok=True)
        cfg = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": hidden,
            "intermediate_size": hidden * 3,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "num_hidden_layers": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "torch_dtype": "bfloat16",
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
        }
        tmp = os.path.join(d, f".config.{os.getpid()}.json")
        with open(tmp, "w") as f:
            json.dump(cfg, f)
        os.replace(tmp, os.path.join(d, "config.json"))
    return d


def engine_config(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    max_num_batched_tokens=8192,
    dtype="bfloat16",
    spec_method="draft_model",
    fusion_max_size_mb=None,
    cudagraph_mode=None,
):
    """The engine's VllmConfig, as ``vllm serve`` would build it
    (``fusion_max_size_mb``: ``pass_config.fi_allreduce_fusion_max_size_mb``;
    ``cudagraph_mode``: a ``CUDAGraphMode`` name, None: vLLM's default)."""
    from vllm.config import (
        CompilationConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    max_model_len = 4096
    mc = ModelConfig(
        model=_model_dir(target_hidden),
        dtype=dtype,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
    )
    nodes = node_count(tp)  # more than one: vLLM's multi-node mp launch
    pc = ParallelConfig(tensor_parallel_size=tp, **({"nnodes": nodes} if nodes > 1 else {}))
    spec = None
    if draft_hidden is not None:
        spec = SpeculativeConfig(
            method=spec_method,
            model=_model_dir(draft_hidden),
            num_speculative_tokens=1,
            target_model_config=mc,
            target_parallel_config=pc,
        )
    return VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        model_config=mc,
        parallel_config=pc,
        speculative_config=spec,
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=min(128, max(1, max_num_batched_tokens // 4)),
            max_model_len=max_model_len,
            is_encoder_decoder=False,
        ),
        compilation_config=CompilationConfig(
            pass_config={
                "fuse_allreduce_rms": True,
                "fi_allreduce_fusion_max_size_mb": fusion_max_size_mb,
            },
            **({"cudagraph_mode": cudagraph_mode} if cudagraph_mode is not None else {}),
        ),
    )


def draft_config(vllm_config):
    """The drafter's VllmConfig, from the tree's own code: DraftModelProposer
    (the V1 model runner's), or, where the V2 model runner is the only one
    (v0.34.0), the draft model's speculator's ``load_draft_model``, whose
    ``get_model`` is SIMULATED (it loads nothing: the config it is given is
    the drafter's)."""
    try:
        from vllm.v1.spec_decode.draft_model import DraftModelProposer
    except ModuleNotFoundError as e:
        if e.name != "vllm.v1.spec_decode.draft_model":
            raise
        return _v2_draft_config(vllm_config)

    proposer = DraftModelProposer.__new__(DraftModelProposer)
    proposer.vllm_config = vllm_config
    proposer.speculative_config = vllm_config.speculative_config
    return proposer._create_draft_vllm_config()


def _v2_draft_config(vllm_config):
    import importlib

    from vllm.v1.worker.gpu.spec_decode.speculator_config import get_speculator_config_class

    spec = vllm_config.speculative_config
    where, _, name = get_speculator_config_class(spec).speculator_class.rpartition(".")
    module = importlib.import_module(where)
    speculator = getattr(module, name).__new__(getattr(module, name))
    speculator.vllm_config = vllm_config
    speculator.speculative_config = spec
    speculator.draft_model_config = spec.draft_model_config
    made = {}

    def get_model(*, vllm_config, **kwargs):
        made["config"] = vllm_config
        return model_stand_in()

    real, module.get_model = module.get_model, get_model
    try:
        speculator.load_draft_model(model_stand_in(), set())
    finally:
        module.get_model = real
    return made["config"]


def worker_init(vllm_config, standalone: bool = False) -> None:
    """A worker starting: gpu_worker.init_worker_distributed_environment
    (simulated collectives and TP group, see the module docstring), then
    ``load_models``.  ``standalone``: the standalone FlashInfer all-reduce
    (VLLM_ALLREDUCE_USE_FLASHINFER=1) is on; the TP group's communicator
    constructs it with the group."""
    import vllm.distributed.parallel_state as ps
    import vllm.v1.worker.gpu_worker as gw

    tp = vllm_config.parallel_config.tensor_parallel_size

    def init_dist(*args, **kwargs):
        ps._NODE_COUNT = node_count(tp)

    def ensure_mp(*args, **kwargs):
        if ps._TP is not None:  # kept from an earlier engine of this process
            assert ps._TP.world_size == tp, "the TP group has another size"
            return
        ps._TP = FakeTPGroup(tp)
        if getattr(ps, "_PP", None) is None:  # one stage (read by v0.34.0's drafter loader)
            ps._PP = types.SimpleNamespace(world_size=1, destroy=lambda: None)
        if standalone:
            import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(vllm_config):
                ps._TP.device_communicator.fi_ar_comm = fiar.FlashInferAllReduce(
                    group=ps._TP.cpu_group, device="cpu"
                )

    gw.init_distributed_environment = init_dist
    gw.ensure_model_parallel_initialized = ensure_mp
    gw.init_worker_distributed_environment(vllm_config, rank=0, local_rank=0)
    load_models(vllm_config)


def model_stand_in(compiled: bool = True):
    """What the model runner's ``get_model()`` returns, reduced to what is
    read of it: a ``torch.nn.Module`` whose backbone is marked
    ``do_not_compile = False`` (SIMULATED: ``@support_torch_compile`` marks a
    model that torch.compile will compile this way; nothing is built)."""
    import torch

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.do_not_compile = not compiled
    return model


def load_models(vllm_config, compiled: bool = True) -> None:
    """The worker's REAL ``Worker.load_model`` (gpu_worker.py).  SIMULATED:
    the model runner (its ``load_model`` builds no model, ``get_model()`` is
    ``model_stand_in()``; with a draft model it creates the drafter's
    VllmConfig, as the drafter's ``load_model`` does before anything is
    compiled: its ``__post_init__`` adds the drafter's fusion limit to the
    compile ranges the models share), and the CUDA allocator settings and
    sleep mode memory pool it scopes (no-ops)."""
    from vllm.v1.worker.gpu_worker import Worker

    def load_model(**kwargs):
        spec = vllm_config.speculative_config
        if spec is not None and spec.uses_draft_model():
            draft_config(vllm_config)

    model = model_stand_in(compiled)
    worker = Worker.__new__(Worker)
    worker.vllm_config = vllm_config
    worker.model_runner = types.SimpleNamespace(load_model=load_model, get_model=lambda: model)
    worker._scoped_allocator_max_split = lambda **kwargs: contextlib.nullcontext()
    worker._maybe_get_memory_pool_context = lambda tag: contextlib.nullcontext()
    # v0.34.0: the weights' external memory charges (nothing is loaded)
    worker._external_weight_charges = types.SimpleNamespace(
        track=contextlib.nullcontext, fallback_bytes=0
    )
    worker.load_model()


def fusion_pass(vllm_config):
    """Construct AllReduceFusionPass as the compiler does."""
    from vllm.compilation.passes.fusion.allreduce_rms_fusion import (
        AllReduceFusionPass,
    )
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vllm_config):
        fpass = AllReduceFusionPass(vllm_config)
    # The compiler's pass manager keeps its passes alive (before patch 0003
    # their __del__ destroys the workspace).
    state["passes"].append(fpass)
    return fpass


def compile_plans(vllm_config, draft: bool) -> dict:
    """{"target": plan[, "draft": plan]}: each model compiled with its own
    fusion pass, the target first, then (``draft``) the drafter with the
    config DraftModelProposer makes for it."""
    plans = {"target": compile_plan(vllm_config, fusion_pass(vllm_config))}
    if draft:
        dcfg = draft_config(vllm_config)
        plans["draft"] = compile_plan(dcfg, fusion_pass(dcfg))
    return plans


def compile_plan(vllm_config, fpass) -> dict:
    """Which compile ranges get the fused op, and the max_token_num it bakes."""
    ranges = vllm_config.compilation_config.get_compile_ranges()
    fused = [
        [r.start, r.end] for r in ranges if fpass is not None and fpass.is_applicable_for_range(r)
    ]
    params = getattr(fpass, "allreduce_params", None)
    return {
        "ranges": [[r.start, r.end] for r in ranges],
        "fused_ranges": fused,
        "max_token_num": getattr(fpass, "max_token_num", None),
        "hidden": vllm_config.model_config.get_hidden_size(),
        # what the pass bakes into each fused op of the compiled graph
        "op_kwargs": params.get_trtllm_fused_allreduce_kwargs() if params else None,
    }


def fusion_covers_budget(vllm_config, plan) -> bool:
    """Fusion is on for every compile range that fits the budget for this model."""
    pc = vllm_config.compilation_config.pass_config
    budget = pc.flashinfer_max_size(vllm_config.parallel_config.tensor_parallel_size)
    if budget is None or plan["max_token_num"] is None:
        return False
    limit = plan["max_token_num"]
    need = [r for r in plan["ranges"] if r[1] <= limit]
    return bool(need) and all(r in plan["fused_ranges"] for r in need)


# rows of a fused call compared with the CPU reference (forward)
CHECKED_ROWS = 256


def forward(plan, num_tokens, pattern="kARResidualRMSNorm", dtype="bfloat16", weight_bias=0.0):
    """Run one fused all-reduce+RMSNorm site of a compiled graph.

    Only if the compiled range holding ``num_tokens`` was fused (otherwise the
    graph has the unfused ops, which never touch FlashInfer).  Returns the
    outputs so the caller can compare them with the unfused reference.
    """
    import torch
    import vllm.compilation.passes.fusion.allreduce_rms_fusion as arf

    rng = next((r for r in plan["ranges"] if r[0] <= num_tokens <= r[1]), None)
    if rng is None or rng not in plan["fused_ranges"]:
        return {"fused": False}
    h = plan["hidden"]
    dt = getattr(torch, dtype)
    exact = numerics()
    if exact:
        g = torch.Generator().manual_seed(num_tokens * 7 + h)
        x = torch.randn(num_tokens, h, generator=g).to(dt)
        res = torch.randn(num_tokens, h, generator=g).to(dt)
        gamma = torch.randn(h, generator=g).to(dt)
        x0, res0 = x.clone(), res.clone()
    else:  # shapes only: the kernels compute nothing (flashinfer_sim.NUMERICS_ENV)
        x, res = torch.empty(num_tokens, h, dtype=dt), torch.empty(num_tokens, h, dtype=dt)
        gamma = torch.ones(h, dtype=dt)
    patterns = arf.flashinfer_comm.AllReduceFusionPattern
    code = getattr(patterns, pattern)
    quant_out = scale = None
    if pattern == "kARResidualRMSNormFP8Quant":
        quant_out = torch.empty(num_tokens, h, dtype=torch.float8_e4m3fn)
        scale = torch.tensor([0.05], dtype=torch.float32)
    torch.ops.vllm.flashinfer_trtllm_fused_allreduce_norm(
        allreduce_in=x,
        residual=res,
        rms_gamma=gamma,
        rms_eps=1e-6,
        pattern_code=code,
        norm_out=None,
        quant_out=quant_out,
        scale_out=None,
        scale_factor=scale,
        weight_bias=weight_bias,
        **plan["op_kwargs"],
    )
    if not exact:
        return {"fused": True, "max_abs_err": None}  # not computed
    # The op works row by row (one token's all-reduce, residual add and
    # RMSNorm): up to CHECKED_ROWS rows, evenly spread from the first to the
    # last, are compared with the reference (all rows of smaller batches).
    rows = torch.linspace(0, num_tokens - 1, min(num_tokens, CHECKED_ROWS)).round().long()
    _, s_ref, n_ref = reference_kernel(x0[rows], res0[rows], gamma, 1e-6, weight_bias, state["tp"])
    err = max(
        (x[rows].float() - n_ref.to(dt).float()).abs().max().item(),
        (res[rows].float() - s_ref.to(dt).float()).abs().max().item(),
    )
    out = {"fused": True, "max_abs_err": err}
    if quant_out is not None:
        m = torch.finfo(torch.float8_e4m3fn).max
        q_ref = (n_ref.to(dt).float() / 0.05).clamp(-m, m).to(torch.float8_e4m3fn)
        out["quant_max_abs_err"] = (quant_out[rows].float() - q_ref.float()).abs().max().item()
    return out


def token_counts(plan, max_num_batched_tokens) -> list[int]:
    """Token counts a compiled graph may send to its fused sites: one token,
    the largest fused compile-range end, and the profile run's batch."""
    ends = [r[1] for r in plan["fused_ranges"]]
    return sorted({1, max_num_batched_tokens, *ends[-1:]})


def forward_all(plan, max_num_batched_tokens, pattern="kARResidualRMSNorm"):
    return {str(n): forward(plan, n, pattern) for n in token_counts(plan, max_num_batched_tokens)}


def workspaces() -> dict:
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    out = {}
    for name in ("_fi_ar_workspace", "_fi_ar_quant_workspace"):
        ws = getattr(fiar, name)
        if ws is None:
            out[name] = None
        elif ws.backend == "trtllm":
            out[name] = {
                "backend": "trtllm",
                "max_token_num": ws.metadata["max_token_num"],
                "hidden_dim": ws.metadata["hidden_dim"],
                "bytes": workspace_bytes(ws),
            }
        else:
            out[name] = {
                "backend": "mnnvl",
                "buffer_size_bytes": ws.buffer_size_bytes,
                "bytes": workspace_bytes(ws),
            }
    return out


def kernel_calls():
    return [list(c) for c in state["kernel_calls"]]


def teardown_tp_group() -> None:
    """What destroy_model_parallel() does to the TP group: the REAL
    ``CudaCommunicator.destroy()`` of its device communicator (unique_name
    "tp:0"; its NCCL, custom all-reduce and all2all members are absent in
    this simulation), then the group is gone."""
    import vllm.distributed.parallel_state as ps

    ps._TP.device_communicator.destroy()
    ps._TP = None


# --------------------------------------------------------------------------
# does a request fit a workspace (the tree's fused op, FlashInfer's checks)
# --------------------------------------------------------------------------
def requested_oneshot(ws, n, hidden, tp, dtype):
    """The ``use_oneshot`` the tree's REAL fused op passes to FlashInfer for an
    (n, hidden) input on workspace ``ws``: the op runs with uninitialised CPU
    tensors, ``ws`` as the workspace it looks up and FlashInfer's
    ``allreduce_fusion`` replaced by a recorder of its arguments."""
    import torch
    import vllm.compilation.passes.fusion.allreduce_rms_fusion as arf

    seen: dict[str, Any] = {}
    saved = {
        name: getattr(arf, name) for name in ("get_fi_ar_workspace", "get_fi_ar_quant_workspace")
    }
    allreduce_fusion = arf.flashinfer_comm.allreduce_fusion
    try:
        for name in saved:
            setattr(arf, name, lambda **kwargs: ws)
        arf.flashinfer_comm.allreduce_fusion = lambda **kwargs: seen.update(kwargs)
        x = torch.empty(n, hidden, dtype=dtype)
        arf.call_trtllm_fused_allreduce_norm(
            allreduce_in=x,
            residual=torch.empty_like(x),
            rms_gamma=torch.empty(hidden, dtype=dtype),
            rms_eps=1e-6,
            world_size=tp,
            launch_with_pdl=True,
            fp32_acc=True,
            max_token_num=n,
            pattern_code=arf.flashinfer_comm.AllReduceFusionPattern.kARResidualRMSNorm,
        )
    finally:
        for name, fn in saved.items():
            setattr(arf, name, fn)
        arf.flashinfer_comm.allreduce_fusion = allreduce_fusion
    return seen["use_oneshot"]


def fits(ws, n, hidden, tp, dtype, standalone=False) -> bool:
    """FlashInfer's own check of an (n, hidden) request against ``ws``, with
    the strategy the tree requests: what its fused op passes
    (``requested_oneshot``), or for the standalone all-reduce none
    (FlashInfer's AUTO decides)."""
    from flashinfer.comm.trtllm_ar import check_trtllm_allreduce_fusion_workspace_metadata
    from flashinfer.comm.trtllm_mnnvl_ar import MNNVLAllreduceFusionStrategy as S

    if ws.backend == "trtllm":
        try:
            check_trtllm_allreduce_fusion_workspace_metadata(n, hidden, tp, dtype, ws.metadata)
        except ValueError:
            return False
        return True
    use_oneshot = None if standalone else requested_oneshot(ws, n, hidden, tp, dtype)
    strategy = (
        S.select_strategy(tp, n, hidden, dtype)
        if use_oneshot is None
        else (S.ONESHOT if use_oneshot else S.TWOSHOT)
    )
    return ws.is_buffer_size_sufficient(tp, n, hidden, dtype, strategy)
