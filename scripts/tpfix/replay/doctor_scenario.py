# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Scenarios of the preflight command (tpfix.preflight.doctor), run by a
``harness.Interpreter`` on a vLLM tree: ``prepare`` ahead (the imports),
then ``parse`` in a fork of the stock tree's, then ``deployment`` in each.

``parse(argv, gpu)``: a ``vllm serve`` command line through the tree's REAL
serve parser (``make_arg_parser`` on a ``FlexibleArgumentParser``,
``validate_parsed_serve_args``), ``AsyncEngineArgs.from_cli_args`` and
``create_engine_config(UsageContext.OPENAI_API_SERVER)``; model and draft
configurations are read from a local path or the local Hugging Face cache
only (``HF_HUB_OFFLINE=1``).  SIMULATED: the device (device.setup: CUDA
platform, capability, 8 GPUs a node; plus the GPU's name and memory, which
pick vLLM's default ``max_num_batched_tokens``) and Ray's presence (vLLM's
check that it can import Ray passes: Ray runs on the deployment's hosts).

``start(order, **facts)``: bug_a's ``cold_start`` or
``warm_start_capture_order`` for the facts, plus what the simulated
workspace holds (buffer and Lamport bytes per rank, read from FlashInfer's
real workspace objects that bug_a builds) and the one-shot/two-shot boundary
as the tree's fusion code and FlashInfer decide it.

Uses from bug_a only: cold_start, warm_start_capture_order; from device:
setup, new_process, import_host_modules.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

# name, memory (GiB): what vLLM's defaults read of the device
GPUS = {90: ("NVIDIA H100 80GB HBM3", 80), 100: ("NVIDIA B200", 180), 103: ("NVIDIA B300", 270)}
GiB = 1024**3


class BadInput(Exception):
    """The serve line or a model configuration cannot be used."""


def _bad(message: str) -> dict:
    return {"error": "BadInput", "message": message}


def _config_json(model: str, what: str) -> str:
    """The local config.json of `model` (a folder or a Hugging Face repo id in
    the local cache), or BadInput naming the path and the fix."""
    if os.path.isdir(model) or model.startswith(("/", ".", "~")):
        path = os.path.join(os.path.expanduser(model), "config.json")
        if not os.path.isfile(path):
            raise BadInput(
                f"{what} {model}: {path} does not exist; pass a model folder that holds "
                "its config.json (weights are not needed)"
            )
        return path
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model, "config.json")
    if not isinstance(found, str):
        raise BadInput(
            f"{what} {model}: no config.json in the local Hugging Face cache "
            f"({os.environ.get('HF_HUB_CACHE') or '~/.cache/huggingface/hub'}); the doctor "
            f"never downloads: run `huggingface-cli download {model} config.json` "
            "or pass a local folder holding its config.json"
        )
    return found


def _parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # v0.27.1
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # v0.33.0
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    parser = FlexibleArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]")
    return make_arg_parser(parser), validate_parsed_serve_args


def parse(
    argv: list[str],
    capability: int = 90,
    backend: str = "trtllm",
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The serve line's engine facts; ``cwd``: the folder the operator's
    relative paths are relative to; ``env``: the deployment's environment,
    of which the ``VLLM_*`` and ``TORCH_COMPILE_DISABLE`` variables are set
    before vLLM reads them."""
    if cwd:
        os.chdir(cwd)
    for k, v in (env or {}).items():
        if k.startswith("VLLM_") or k == "TORCH_COMPILE_DISABLE":
            os.environ[k] = v
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from tpfix.replay.device import setup

    setup(2, capability, backend)
    from vllm.platforms import current_platform

    name, mem = GPUS[capability]
    current_platform.get_device_name = lambda device_id=0: name
    current_platform.get_device_total_memory = lambda device_id=0: mem * GiB
    current_platform.device_type = "cuda"  # DeviceConfig(device="auto") infers it
    # classmethods reading the class's own capability: the simulated one
    as_int = lambda c: c if isinstance(c, int) else c[0] * 10 + c[1]  # noqa: E731
    current_platform.is_device_capability = lambda c, device_id=0: as_int(c) == capability
    current_platform.is_device_capability_family = (
        lambda c, device_id=0: as_int(c) // 10 == capability // 10
    )

    _stand_in_for_ray()

    parser, validate = _parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"error": "ArgumentError", "message": lines[-1] if lines else "bad arguments"}
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    elif not any(a == "--model" or a.startswith("--model=") for a in argv):
        # vLLM would fall back to its default model, which the operator never named
        return _bad("no model given: name it as `vllm serve MODEL ...` or with --model")
    try:  # before vLLM looks for them (it would try the Hub)
        _config_json(args.model, "model")
        draft = (args.speculative_config or {}).get("model")
        if draft:
            _config_json(draft, "draft model (--speculative-config)")
    except BadInput as e:
        return _bad(str(e))
    validate(args)
    import vllm.envs as envs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    engine_args = AsyncEngineArgs.from_cli_args(args)
    cfg = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    spec = cfg.speculative_config
    dmc = getattr(spec, "draft_model_config", None) if spec else None
    return {
        "no_fusion": _no_fusion(cfg, argv),
        "quantization": cfg.model_config.quantization,
        "model": cfg.model_config.model,
        "architectures": list(cfg.model_config.architectures or []),
        "target_hidden": cfg.model_config.get_hidden_size(),
        "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
        "tp": cfg.parallel_config.tensor_parallel_size,
        "pp": cfg.parallel_config.pipeline_parallel_size,
        "dp": cfg.parallel_config.data_parallel_size,
        "executor": str(cfg.parallel_config.distributed_executor_backend),
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "fuse_allreduce_rms": bool(cfg.compilation_config.pass_config.fuse_allreduce_rms),
        "fusion_max_size_mb": cfg.compilation_config.pass_config.fi_allreduce_fusion_max_size_mb,
        "compilation_mode": cfg.compilation_config.mode.name,
        "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode),
        "standalone_allreduce": bool(getattr(envs, "VLLM_ALLREDUCE_USE_FLASHINFER", False)),
        "spec_method": getattr(spec, "method", None) if spec else None,
        "draft_model": dmc.model if dmc is not None else None,
        "draft_architectures": list(dmc.architectures or []) if dmc is not None else [],
        "draft_hidden": dmc.get_hidden_size() if dmc is not None else None,
    }


def _stand_in_for_ray() -> None:
    """Ray runs on the deployment's hosts, not necessarily here. Without it,
    vLLM's check that Ray imports passes where the serve line names the Ray
    executor (auto-selection still sees no Ray here), and its executor (which imports
    Ray) is stood in by the class it derives from, for the one thing the
    configuration asks of it (whether it supports async scheduling):
    RayExecutorV2 is a MultiprocExecutor, RayDistributedExecutor (v0.27.1
    with VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) an Executor."""
    import vllm.envs as envs
    from vllm.v1.executor import ray_utils
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    if ray_utils.ray is not None:
        return
    ray_utils.assert_ray_available = lambda: None  # its check for an explicit "ray"
    get_class = Executor.get_class

    def ray_stand_in(vllm_config):
        if vllm_config.parallel_config.distributed_executor_backend != "ray":
            return get_class(vllm_config)
        v2 = getattr(envs, "VLLM_USE_RAY_V2_EXECUTOR_BACKEND", True)
        return MultiprocExecutor if v2 else Executor

    Executor.get_class = staticmethod(ray_stand_in)


def _no_fusion(cfg, argv: list[str]) -> str | None:
    """Why the resolved configuration runs no fused all-reduce, or None, and
    what in the deployment made it so: the fusion pass runs only in
    VLLM_COMPILE mode (which --enforce-eager, -O0, TORCH_COMPILE_DISABLE=1 or
    -cc.mode turn off: vLLM sets the mode), with pass_config.fuse_allreduce_rms
    (set on the line, or its default for the -O level and platform), at a TP
    size FlashInfer's fusion has a size for."""
    from vllm.config import CompilationMode

    cc, tp = cfg.compilation_config, cfg.parallel_config.tensor_parallel_size
    level = getattr(cfg, "optimization_level", None)
    if tp <= 1:
        return "TP 1: no all-reduce"
    if cc.mode != CompilationMode.VLLM_COMPILE:
        if cfg.model_config.enforce_eager:
            why = "--enforce-eager"
        elif os.environ.get("TORCH_COMPILE_DISABLE") == "1":  # vLLM's test, and torch's
            why = "TORCH_COMPILE_DISABLE=1"
        elif level is not None and int(level) == 0:
            why = "-O0"
        else:
            why = f"compilation mode {cc.mode.name.lower()}"
        return f"{why}: vLLM compiles nothing, so no fusion pass runs"
    if not cc.pass_config.fuse_allreduce_rms:
        if any("fuse_allreduce_rms" in a for a in argv):
            return "fuse_allreduce_rms is off on the serve line"
        o = f"-O{int(level)}" if level is not None else "this -O level"
        return f"fuse_allreduce_rms is off: vLLM's default at {o} on this GPU"
    if cc.pass_config.flashinfer_max_size(tp) is None:
        return f"FlashInfer's fused all-reduce has no size for TP {tp} on this GPU"
    return None


def _sizes(ws, dtype) -> dict[str, Any] | None:
    """What a (simulated) FlashInfer workspace holds per rank, in bytes."""
    if ws is None:
        return None
    if ws.backend == "trtllm":
        m = ws.metadata
        return {
            "backend": "trtllm",
            "max_token_num": m["max_token_num"],
            "hidden_dim": m["hidden_dim"],
            "buffer_bytes": m["buffer_size"],
            "lamport_bytes": m["lamport_buffer_size"],
        }
    return {
        "backend": "mnnvl",
        "buffer_bytes": ws.buffer_size_bytes,
        "lamport_bytes": ws.workspace_size_bytes,  # the 3 Lamport buffers
    }


def _oneshot_limit(backend, capability, tp, hidden, limit, dtype) -> int | None:
    """The largest token count (<= limit) sent one-shot: vLLM's choice
    (``_select_flashinfer_allreduce_use_oneshot`` of the tree), or where vLLM
    leaves it to FlashInfer (None), FlashInfer's AUTO strategy."""
    import torch
    import vllm.compilation.passes.fusion.allreduce_rms_fusion as arf

    dt = getattr(torch, dtype)
    elem = torch.tensor([], dtype=dt).element_size()
    select = getattr(arf, "_select_flashinfer_allreduce_use_oneshot", None)
    best = 0
    for n in range(1, limit + 1):
        choice = select(backend, capability, tp, n * hidden * elem) if select else None
        if choice is None:
            if backend == "mnnvl":
                from flashinfer.comm.trtllm_mnnvl_ar import MNNVL_ONE_SHOT_THRESHOLD

                choice = n * hidden * tp * elem <= MNNVL_ONE_SHOT_THRESHOLD
            else:
                from flashinfer.comm.trtllm_ar import _should_use_oneshot

                choice = _should_use_oneshot(n, hidden, dt, tp)
        if not choice:
            break
        best = n
    return best


def start(
    order: str,
    target_hidden: int,
    draft_hidden: int | None,
    tp: int,
    capability: int,
    max_num_batched_tokens: int,
    backend: str,
    dtype: str = "bfloat16",
    fusion_max_size_mb: float | None = None,
    cudagraph_mode: str | None = None,
) -> dict[str, Any]:
    """bug_a's cold start (``order="cold"``) or warm start in vLLM's start
    order (``"warm"``: its CUDA graph capture as ``cudagraph_mode`` has it)
    for these facts; an error comes back as its type and message, with the
    workspace as it was when the start died."""
    from tpfix.replay import bug_a

    run = {"cold": bug_a.cold_start, "warm": bug_a.warm_start_capture_order}[order]
    kw = dict(
        target_hidden=target_hidden,
        draft_hidden=draft_hidden,
        tp=tp,
        capability=capability,
        max_num_batched_tokens=max_num_batched_tokens,
        backend=backend,
        fusion_max_size_mb=fusion_max_size_mb,
    )
    if order == "warm":  # the cold start captures nothing
        kw["cudagraph_mode"] = cudagraph_mode
    try:
        result = run(**kw)
    except Exception as e:  # noqa: BLE001  (reported like the harness does)
        result = {"error": type(e).__name__, "message": str(e)}
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    result["workspace"] = _sizes(getattr(fiar, "_fi_ar_workspace", None), dtype)
    result["quant_workspace"] = _sizes(getattr(fiar, "_fi_ar_quant_workspace", None), dtype)
    ws = result["workspace"] or {}
    limit = ws.get("max_token_num") or max_num_batched_tokens
    result["oneshot_max_tokens"] = {
        name: _oneshot_limit(backend, capability, tp, h, limit, dtype)
        for name, h in (("target", target_hidden), ("draft", draft_hidden))
        if h is not None
    }
    return result


def prepare(backend: str) -> None:
    """What ``deployment`` imports before its facts matter (the device
    layer's host-side imports and the replay's modules): the preflight runs
    it in the deployment's interpreter while vLLM parses the serve line."""
    import tpfix.replay.bug_a  # noqa: F401
    from tpfix.replay.device import import_host_modules

    import_host_modules(backend)


def deployment(**facts: Any) -> dict[str, Any]:
    """The deployment's cold start, then (a new process, the AOT cache now
    warm) its warm start in vLLM's start order: ``start("cold")`` and
    ``start("warm")`` in one interpreter, with device.new_process between.
    The simulated kernels record each launch but compute nothing: the doctor
    reads shapes, sizes and errors, never the values (the tests compare
    those with CPU references)."""
    import gc

    from tpfix.replay.device import new_process
    from tpfix.replay.flashinfer_sim import NUMERICS_ENV

    os.environ[NUMERICS_ENV] = "0"  # this interpreter runs the doctor's replay only
    cold = start("cold", **facts)
    new_process()
    gc.collect()  # the cold run's passes are gone, as in a new process
    return {"cold": cold, "warm": start("warm", **facts)}
