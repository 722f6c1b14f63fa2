# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""FlashInfer without a GPU, for the simulated device (tpfix.replay.device):
the sizing formulas of its workspaces (the TRT-LLM IPC metadata, the MNNVL
buffer and multicast allocation sizes, as FlashInfer computes them), its REAL
workspace classes built with ``cls.__new__`` (no GPU memory behind them), and
CPU reference kernels in place of its compiled comm modules.  Creations,
destructions and kernel launches are counted in ``device.state``.

Used by ``device.setup()`` (workspaces and kernels), by
``recorder.setup_recording()`` (the sizing formulas), by tpfix.replay.engine
(``reference_kernel``, ``workspace_bytes``) and by tpfix.bench.measure.
"""

from __future__ import annotations

import os
import types

from tpfix.replay.device import state

# "0": the kernels only record their launch and compute nothing (the doctor,
# which judges shapes, sizes and errors, never values); the tests keep the
# default, CPU references whose outputs they compare.
NUMERICS_ENV = "TPFIX_REPLAY_NUMERICS"


def numerics() -> bool:
    """Whether the simulated kernels compute their outputs (NUMERICS_ENV)."""
    return os.environ.get(NUMERICS_ENV, "1") != "0"


def mnnvl_allocation_usable(request_bytes: int, granularity: int = 1) -> int:
    """Usable bytes of an MNNVL multicast allocation of ``request_bytes``
    (FlashInfer 0.6.16.post4, mnnvl.py ``_get_allocation_prop``,
    ``get_usable_buffer_size``): request plus ``SIGNAL_PAD_SIZE`` rounded up
    to the allocation ``granularity``, minus the pad.  The device's
    granularity is hardware data; 1 gives the smallest buffer."""
    from flashinfer.comm.mnnvl import SIGNAL_PAD_SIZE

    allocation = -(-(request_bytes + SIGNAL_PAD_SIZE) // granularity) * granularity
    return allocation - SIGNAL_PAD_SIZE


def workspace_bytes(ws) -> int:
    """Bytes per rank of a (simulated) FlashInfer workspace."""
    if ws.backend == "trtllm":
        m = ws.metadata
        r16 = lambda n: (n + 15) // 16 * 16  # noqa: E731
        return r16(m["buffer_size"]) + r16(m["flag_size"]) + r16(m["lamport_buffer_size"])
    return ws.workspace_size_bytes


def trtllm_sizes(world_size, max_token_num, hidden_dim, dtype):
    """FlashInfer's trtllm_create_ipc_workspace_for_all_reduce_fusion sizing."""
    import torch
    from flashinfer.comm import trtllm_ar

    use_fp32_lamport = dtype == torch.float32
    buffer_size = world_size * max_token_num * hidden_dim * 2
    flag_size = world_size * trtllm_ar.BarrierFlagCount * 4
    lamport_comm_size = world_size * max_token_num * hidden_dim * (4 if use_fp32_lamport else 2)
    lamport_comm_size = min(lamport_comm_size, trtllm_ar.MAX_COMM_SIZE)
    return {
        "tp_rank": 0,
        "tp_size": world_size,
        "max_token_num": max_token_num,
        "hidden_dim": hidden_dim,
        "use_fp32_lamport": use_fp32_lamport,
        "buffer_size": buffer_size,
        "flag_size": flag_size,
        "lamport_comm_size": lamport_comm_size,
        "lamport_buffer_size": lamport_comm_size * 3,
    }


def mnnvl_buffer_size(world_size, max_token_num, hidden_dim, dtype, force_oneshot):
    """FlashInfer's MNNVLAllReduceFusionWorkspace.__init__ buffer sizing."""
    import torch
    from flashinfer.comm.trtllm_mnnvl_ar import (
        MNNVL_ONE_SHOT_THRESHOLD,
        MNNVLAllreduceFusionStrategy,
        MNNVLAllReduceFusionWorkspace,
    )

    req = MNNVLAllReduceFusionWorkspace.get_required_buffer_size_bytes
    if force_oneshot:
        return req(
            world_size,
            max_token_num,
            hidden_dim,
            dtype,
            MNNVLAllreduceFusionStrategy.ONESHOT,
        )
    elem = torch.tensor([], dtype=dtype).element_size()
    oneshot_tokens = min(
        MNNVL_ONE_SHOT_THRESHOLD // (world_size * elem * hidden_dim), max_token_num
    )
    return max(
        req(
            world_size,
            oneshot_tokens,
            hidden_dim,
            dtype,
            MNNVLAllreduceFusionStrategy.ONESHOT,
        ),
        req(
            world_size,
            max_token_num,
            hidden_dim,
            dtype,
            MNNVLAllreduceFusionStrategy.TWOSHOT,
        ),
    )


def mnnvl_usable_buffer_bytes(buffer_size_in_bytes: int, granularity: int = 1) -> int:
    """``buffer_size_bytes`` of FlashInfer's MNNVL workspace (0.6.16.post4)
    for a requested per-buffer size: the 3 Lamport buffers plus
    ``SIGNAL_PAD_SIZE`` are rounded up to the allocation ``granularity``
    (mnnvl.py ``_get_allocation_prop``), the usable size is that minus the
    pad (``get_usable_buffer_size``), and each buffer is a third of it,
    16-byte aligned (``MNNVLAllReduceFusionWorkspace.__init__``).  The
    device's granularity is hardware data; 1 gives the smallest buffer."""
    from flashinfer.comm.trtllm_mnnvl_ar import MNNVLAllReduceFusionWorkspace

    n = MNNVLAllReduceFusionWorkspace.NUM_LAMPORT_BUFFERS
    return mnnvl_allocation_usable(buffer_size_in_bytes * n, granularity) // n // 16 * 16


def make_workspace(
    backend,
    world_size,
    rank,
    max_token_num,
    hidden_dim,
    dtype,
    force_oneshot_support=False,
    buffer_size_in_bytes=None,
):
    """A real FlashInfer workspace object without GPU memory (cls.__new__)."""
    from flashinfer.comm.allreduce import TRTLLMAllReduceFusionWorkspace
    from flashinfer.comm.trtllm_mnnvl_ar import MNNVLAllReduceFusionWorkspace

    if backend == "trtllm":
        ws = TRTLLMAllReduceFusionWorkspace.__new__(TRTLLMAllReduceFusionWorkspace)
        ws.metadata = trtllm_sizes(world_size, max_token_num, hidden_dim, dtype)
        ws.ipc_handles = []
        ws.workspace_tensor = None
        ws.mem_handles = []
        ws._internal_workspace = (None, None, ws.metadata)
    elif backend == "mnnvl":
        ws = MNNVLAllReduceFusionWorkspace.__new__(MNNVLAllReduceFusionWorkspace)
        if buffer_size_in_bytes is None:
            buffer_size_in_bytes = mnnvl_buffer_size(
                world_size, max_token_num, hidden_dim, dtype, force_oneshot_support
            )
        ws.tp_size = world_size
        ws.buffer_size_bytes = mnnvl_usable_buffer_bytes(buffer_size_in_bytes)
        ws.workspace_size_bytes = ws.buffer_size_bytes * ws.NUM_LAMPORT_BUFFERS
        ws.handle = types.SimpleNamespace()
        ws.mc_ptr = 1
        ws.uc_ptrs_dev = ws.uc_ptr_local = ws.buffer_flags = None
    else:
        raise RuntimeError(f"Unknown backend: {backend}")
    ws.world_size = world_size
    ws.rank = rank
    # No GPU memory behind it: __del__ is a no-op, destroy() is recorded.
    ws._destroyed = True
    ws.destroy = lambda: state["destroyed"].append(id(ws))
    state["created"].append(
        {
            "backend": backend,
            "max_token_num": max_token_num,
            "hidden_dim": hidden_dim,
            "bytes": workspace_bytes(ws),
        }
    )
    return ws


def reference_kernel(x, residual_in, gamma, eps, weight_bias, world_size):
    """CPU reference of all-reduce (+ residual add + RMSNorm)."""
    import torch

    ar = x.float() * world_size
    if residual_in is None:
        return ar, None, None
    s = ar + residual_in.float()
    normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    normed = normed * (gamma.float() + weight_bias)
    return ar, s, normed


class FakeTrtllmModule:
    """Stands in for FlashInfer's compiled trtllm comm module (the kernel)."""

    def trtllm_allreduce_fusion(self, **kw):
        import torch

        state["kernel_calls"].append(("trtllm", kw["token_num"], kw["hidden_dim"]))
        if not numerics():
            return
        n, h = kw["token_num"], kw["hidden_dim"]
        x = kw["allreduce_in"].view(n, h)
        res = kw.get("residual_in")
        res = res.view(n, h) if res is not None else None
        gamma = kw.get("rms_gamma")
        ar, s, normed = reference_kernel(
            x,
            res,
            gamma,
            kw.get("rms_eps") or 1e-6,
            kw.get("weight_bias") or 0.0,
            kw["world_size"],
        )
        if kw.get("allreduce_out") is not None:
            kw["allreduce_out"].view(n, h).copy_(ar)
        if s is not None and kw.get("residual_out") is not None:
            kw["residual_out"].view(n, h).copy_(s)
        if normed is not None and kw.get("norm_out") is not None:
            kw["norm_out"].view(n, h).copy_(normed)
        q = kw.get("quant_out")
        if q is not None and q.dtype == torch.float8_e4m3fn:
            m = torch.finfo(q.dtype).max
            scale = kw["scale_factor"].float()
            normed = normed.to(kw["allreduce_in"].dtype).float()
            q.view(n, h).copy_((normed / scale).clamp(-m, m).to(q.dtype))


class FakeMnnvlModule:
    """Stands in for FlashInfer's compiled MNNVL comm module (the kernel)."""

    def trtllm_mnnvl_allreduce_fusion(
        self,
        inp,
        mc_ptr,
        uc_ptrs,
        uc_local,
        flags,
        tp_size,
        rank,
        rmsnorm,
        pdl,
        oneshot,
        output,
        residual_out=None,
        residual_in=None,
        gamma=None,
        eps=1e-6,
        weight_bias=0.0,
        *args,
    ):
        state["kernel_calls"].append(("mnnvl", inp.shape[0], inp.shape[1]))
        if not numerics():
            return
        ar, s, normed = reference_kernel(
            inp, residual_in if rmsnorm else None, gamma, eps, weight_bias, tp_size
        )
        if not rmsnorm:
            output.copy_(ar)
            return
        output.copy_(normed)
        residual_out.copy_(s)

    def __getattr__(self, name):
        def kernel(*args, **kwargs):
            state["kernel_calls"].append(("mnnvl:" + name, None, None))

        return kernel
