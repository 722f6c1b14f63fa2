# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The recording layer under bug_b's replays of the fused op (also used by
the benchmarks in tpfix.bench.measure): the other way of installing the
simulated device of tpfix.replay.device, whose platform, single node and
collectives it shares, with flashinfer_sim's sizing formulas.

``setup_recording()`` (bug_b's replays of the fused op).  FlashInfer's REAL
``create_allreduce_fusion_workspace`` and workspace constructors run,
including ``MNNVLAllReduceFusionWorkspace.__init__``'s sizing branch; what is
SIMULATED:
  * GPU memory: only ``McastGPUBuffer`` (the MNNVL multicast allocation) is
    replaced by an object that reports the usable size FlashInfer
    0.6.16.post4 gets from the driver (``mnnvl_allocation_usable``: the
    request plus ``SIGNAL_PAD_SIZE`` rounded up to the allocation granularity
    ``recording["granularity"]``, minus the pad); ``torch.cuda`` /
    ``torch.device("cuda")`` inside trtllm_mnnvl_ar map to the CPU;
    ``trtllm_create_ipc_workspace_for_all_reduce_fusion`` returns the
    metadata of ``trtllm_sizes`` without allocating;
  * kernels: recorders of the strategy FlashInfer would launch
    (``use_oneshot``); every FlashInfer check before the launch is real;
  * the TP group: rank 0 of ``recording["tp_group"].world_size`` ranks
    (``get_tp_group`` with no standalone FlashInfer all-reduce on its device
    communicator, ``get_tensor_model_parallel_rank``); the other ranks agree
    to every creation (``AgreeingDist``: every all-reduce leaves its input); no
    CUDA graph is captured;
  * the device: as for ``setup()``, without static graph support and device
    count (nothing reads them there), at the capability of each case.
"""

from __future__ import annotations

import types
from typing import Any

from tpfix.replay.device import AgreeingDist, simulate_cuda_platform, simulate_single_node
from tpfix.replay.flashinfer_sim import mnnvl_allocation_usable, trtllm_sizes

# What setup_recording() installed (its modules, launches, allocations).
recording: dict[str, Any] = {}


def setup_recording() -> dict[str, Any]:
    """Install the recording layer (module docstring) once; returns
    ``recording``: the modules it patched, ``launches``, ``allocations``,
    ``tp_group`` and the MNNVL allocation ``granularity`` (1 until a case
    sets it)."""
    if recording:
        return recording
    import flashinfer.comm.allreduce as fi_allreduce
    import flashinfer.comm.trtllm_ar as fi_trtllm
    import flashinfer.comm.trtllm_mnnvl_ar as fi_mnnvl
    import torch

    from tpfix.replay import vllm_cpu_stubs  # noqa: F401  (CPU stand-ins for torch.ops._C)

    launches: list[dict[str, Any]] = []
    allocations: list[dict[str, Any]] = []

    # -- MNNVL: real constructor, simulated multicast allocation -----------
    class _SimMcastGPUBuffer:
        def __init__(
            self,
            buf_size,
            group_size,
            group_rank,
            device,
            comm_backend_for_handle_transfer=None,
            **_,
        ):
            self.buf_size = mnnvl_allocation_usable(buf_size, recording["granularity"])
            self.mcast_device_memory = types.SimpleNamespace(
                get_buffer_ptrs_host=lambda: [0] * group_size
            )
            allocations.append(
                {
                    "backend": "mnnvl",
                    "requested_workspace_bytes": buf_size,
                    "usable_bytes": self.buf_size,
                }
            )

        def lamport_initialize(self, rank, dtype):
            pass

        def get_buffer_ptrs_dev(self):
            return 0

        def get_unicast_ptr(self, rank):
            return 0

        def get_multicast_ptr(self):
            return 1  # multicast available

    class _CpuTorch(types.ModuleType):
        """``torch`` as seen from trtllm_mnnvl_ar: cuda devices map to CPU."""

        def __getattr__(self, name):
            return getattr(torch, name)

    cpu_torch = _CpuTorch("torch")
    cpu_torch.device = lambda *a, **k: torch.device("cpu")
    cpu_torch.cuda = types.SimpleNamespace(current_device=lambda: 0, synchronize=lambda: None)
    fi_mnnvl.torch = cpu_torch
    fi_mnnvl.McastGPUBuffer = _SimMcastGPUBuffer

    def _sim_mnnvl_module():
        def trtllm_mnnvl_allreduce_fusion(*args):
            launches.append({"backend": "mnnvl", "use_oneshot": bool(args[9])})

        return types.SimpleNamespace(trtllm_mnnvl_allreduce_fusion=trtllm_mnnvl_allreduce_fusion)

    fi_mnnvl.get_trtllm_mnnvl_comm_module = _sim_mnnvl_module

    # -- TRT-LLM: simulated IPC allocation, same metadata formulas ---------
    def _sim_trtllm_ipc(
        tp_rank,
        tp_size,
        max_token_num,
        hidden_dim,
        use_fp32_lamport=False,
        group=None,
        create_metadata=False,
        comm_backend=None,
        use_symm_dev_mem=False,
    ):
        # trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion's sizing
        dtype = torch.float32 if use_fp32_lamport else torch.bfloat16
        metadata = trtllm_sizes(tp_size, max_token_num, hidden_dim, dtype)
        metadata["tp_rank"] = tp_rank
        allocations.append({"backend": "trtllm", **metadata})
        return [], None, [], metadata

    fi_allreduce.trtllm_create_ipc_workspace_for_all_reduce_fusion = _sim_trtllm_ipc

    def _sim_trtllm_module():
        def trtllm_allreduce_fusion(**kwargs):
            launches.append({"backend": "trtllm", "use_oneshot": bool(kwargs["use_oneshot"])})

        return types.SimpleNamespace(trtllm_allreduce_fusion=trtllm_allreduce_fusion)

    fi_trtllm.get_trtllm_comm_module = _sim_trtllm_module

    # -- vLLM side: rank 0 of a TP group, given device capability ----------
    import vllm.distributed.device_communicators.flashinfer_all_reduce as vfi
    from vllm.compilation.passes.fusion import allreduce_rms_fusion as arf

    # the other ranks agree (patch 0004's creation all-reduce); no capture
    simulate_single_node(vfi, AgreeingDist)
    group = types.SimpleNamespace(name="tp-cpu-group")
    tp_group = types.SimpleNamespace(
        world_size=2,  # set per case
        rank_in_group=0,
        cpu_group=group,
        device_communicator=types.SimpleNamespace(fi_ar_comm=None),
    )
    arf.get_tp_group = vfi.get_tp_group = lambda: tp_group
    arf.get_tensor_model_parallel_rank = lambda: 0
    simulate_cuda_platform(90, static_graphs=False)

    recording.update(
        torch=torch,
        fi_mnnvl=fi_mnnvl,
        fi_trtllm=fi_trtllm,
        fi_allreduce=fi_allreduce,
        vfi=vfi,
        arf=arf,
        launches=launches,
        allocations=allocations,
        group=group,
        tp_group=tp_group,
        granularity=1,
    )
    return recording
