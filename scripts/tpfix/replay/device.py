# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The simulated device under the replays: GPU, TP group, torch.distributed,
FlashInfer's GPU allocation and kernels.  Everything else the replays run is
the REAL code of the vLLM tree under test and of the FlashInfer it pins.

Two ways to install it, one per kind of replay (both in this module, sharing
the platform, the single node, the collectives, the capture flag and
FlashInfer's sizing formulas):

``setup()`` (bug_a's engine replays, and the benchmarks in tpfix.bench.measure).
What is SIMULATED (there is no GPU):
  * the device: ``current_platform.is_cuda()`` and
    ``support_static_graph_mode()`` return True (as CudaPlatform's do),
    ``get_device_capability()`` the chosen SM version and ``device_count()`` 8;
  * torch.distributed: a fake TP group coordinator (``world_size`` = TP, rank
    0, one node, ``unique_name`` "tp:0") is installed in
    ``vllm.distributed.parallel_state`` by the worker's
    ``ensure_model_parallel_initialized`` (which keeps an existing group, as
    the real one does; a simulated new process has none).  Its all-reduce
    returns ``input * world_size`` (every rank holds the same partial sums).
    Its ``device_communicator`` is a real ``CudaCommunicator`` made with
    ``__new__`` (no NCCL, custom or quick all-reduce, symmetric memory or
    all2all: those members are None); with the standalone FlashInfer
    all-reduce on, its ``fi_ar_comm`` is the real ``FlashInferAllReduce``,
    constructed when the group is, as ``CudaCommunicator.__init__`` does at
    init_device (before the models are loaded);
  * the other ranks: one peer stands for them.  It attempts creation
    whenever this rank does while it has no workspace, and its first
    ``peer_fails`` attempts fail; it answers the MIN all-reduce of the
    creation agreement (trees with one) with its outcome and, like this rank,
    frees its workspace when the agreement says some rank has none;
  * the model runner: its ``load_model`` loads nothing; ``get_model()``
    returns a ``torch.nn.Module`` stand-in whose backbone carries
    ``do_not_compile = False``, as ``@support_torch_compile`` marks a model
    that torch.compile will compile (no real model is built); with a draft
    model it creates the drafter's VllmConfig, as the drafter's load does;
  * GPU allocation: ``flashinfer.comm.create_allreduce_fusion_workspace``
    builds FlashInfer's real workspace classes with ``cls.__new__`` and sets
    their sizing attributes with FlashInfer's own formulas
    (``trtllm_create_ipc_workspace_for_all_reduce_fusion`` metadata;
    ``MNNVLAllReduceFusionWorkspace.__init__`` buffer size at allocation
    granularity 1, the smallest buffer FlashInfer can end up with); while a
    CUDA graph is being captured (``_state["capturing"]``) it refuses, as
    CUDA does ("operation not permitted when stream is capturing");
  * CUDA graph capture: ``_state["capturing"]`` (also what
    ``torch.cuda.is_current_stream_capturing()`` returns); no graph is
    recorded, the captured forward runs like any other;
  * kernels: FlashInfer's JIT modules (``get_trtllm_comm_module``,
    ``get_trtllm_mnnvl_comm_module``) are replaced by CPU reference kernels;
    everything FlashInfer does before the launch runs for real;
  * vLLM's ``torch.ops._C`` ops looked up at import: ``vllm_cpu_stubs``;
  * "a new process" (warm start) is simulated inside one interpreter by
    destroying the workspaces, forgetting the planned shape and the failure
    latches, and dropping the TP group;
  * a model loaded from the AOT compile cache (``engine.forward``): the fused
    ops of the compiled graph called with the arguments a first (cold) run's pass baked into
    them, without constructing a pass.

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
    to every creation (``FakeDist`` with the peer holding a workspace); no
    CUDA graph is captured;
  * the device: as for ``setup()``, without static graph support and device
    count (nothing reads them there), at the capability of each case.
"""

from __future__ import annotations

import os
import types
from typing import Any

MiB = 1024 * 1024
# CUDA's refusal of an allocation on a capturing stream.
CAPTURE_REFUSAL = "operation not permitted when stream is capturing"

# The simulated process (setup(); new_process() starts a new one).
state: dict[str, Any] = {"capturing": False}
# What setup_recording() installed (its modules, launches, allocations).
recording: dict[str, Any] = {}


# --------------------------------------------------------------------------
# shared by both: platform, node, collectives
# --------------------------------------------------------------------------
GPUS_PER_NODE = 8


def node_count(tp: int) -> int:
    """Nodes a TP group of ``tp`` spans, at GPUS_PER_NODE GPUs a node (TP 16:
    two nodes of an NVLink domain, which only MNNVL spans)."""
    return max(1, -(-tp // GPUS_PER_NODE))


def simulate_cuda_platform(capability: int, static_graphs: bool = True) -> None:
    """``current_platform`` as CudaPlatform answers on an SM ``capability``
    device; ``static_graphs``: also static graph support and 8 devices."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    current_platform.is_cuda = lambda: True
    if static_graphs:
        current_platform.support_static_graph_mode = lambda: True
        current_platform.device_count = lambda: GPUS_PER_NODE
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(
        capability // 10, capability % 10
    )


class _SimCommBackend:
    """FlashInfer's TorchDistBackend without a process group."""

    def __init__(self, group=None):
        self.group = group

    def barrier(self):
        pass


def simulate_single_node(fiar, dist=None) -> None:
    """flashinfer_all_reduce on one node, with ``dist`` (default FakeDist,
    the peer model) as torch.distributed and capture as
    ``state["capturing"]`` says."""
    import torch

    fiar.TorchDistBackend = _SimCommBackend
    nodes = state.get("nodes", 1)
    fiar.get_node_count = lambda: nodes
    if hasattr(fiar, "_node_count"):  # v0.33.0+
        fiar._node_count = lambda group: nodes
    fiar.dist = dist or FakeDist
    torch.cuda.is_current_stream_capturing = lambda: state["capturing"]


def mnnvl_allocation_usable(request_bytes: int, granularity: int = 1) -> int:
    """Usable bytes of an MNNVL multicast allocation of ``request_bytes``
    (FlashInfer 0.6.16.post4, mnnvl.py ``_get_allocation_prop``,
    ``get_usable_buffer_size``): request plus ``SIGNAL_PAD_SIZE`` rounded up
    to the allocation ``granularity``, minus the pad.  The device's
    granularity is hardware data; 1 gives the smallest buffer."""
    from flashinfer.comm.mnnvl import SIGNAL_PAD_SIZE

    allocation = -(-(request_bytes + SIGNAL_PAD_SIZE) // granularity) * granularity
    return allocation - SIGNAL_PAD_SIZE


def _device_communicator(cpu_group, world_size: int):
    """The TP group's REAL ``CudaCommunicator``, made with ``__new__``: none of
    the communicators it would build on a GPU (they are None)."""
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    comm = CudaCommunicator.__new__(CudaCommunicator)
    comm.cpu_group = comm.device_group = cpu_group
    comm.unique_name = "tp:0"
    comm.world_size, comm.rank, comm.ranks = world_size, 0, list(range(world_size))
    comm.pynccl_comm = comm.ca_comm = comm.qr_comm = comm.symm_mem_comm = None
    comm.aiter_ar_comm = comm.fi_ar_comm = comm.all2all_manager = None
    comm.fi_pcie_ipc_ar_comm = None  # v0.33.0+
    return comm


class FakeTPGroup:
    """Simulated TP GroupCoordinator: rank 0 of ``world_size`` ranks."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.rank_in_group = 0
        self.rank = 0
        self.local_rank = 0
        self.cpu_group = types.SimpleNamespace(name=f"fake_tp{world_size}")
        self.device_group = self.cpu_group
        self.unique_name = "tp:0"
        self.device_communicator = _device_communicator(self.cpu_group, world_size)
        self.all_reduce_calls = 0

    def all_reduce(self, x):
        self.all_reduce_calls += 1
        return x * self.world_size


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


class FakeDist:
    """torch.distributed as flashinfer_all_reduce uses it.  The MIN
    all-reduce of the creation agreement (trees that have one) gets the
    peer's outcome of the same creation (module docstring); a rank that
    learns that some rank has no workspace frees its own, the peer too."""

    ReduceOp = types.SimpleNamespace(MIN="min")

    @staticmethod
    def get_world_size(group=None):
        import vllm.distributed.parallel_state as ps

        return ps._TP.world_size

    @staticmethod
    def get_rank(group=None):
        return 0

    @staticmethod
    def all_reduce(tensor, op=None, group=None):
        state["collectives"] += 1
        if not state["peer_has_workspace"]:
            tensor.zero_()
        elif op == FakeDist.ReduceOp.MIN and not tensor.min().item():
            state["peer_has_workspace"] = False  # the peer frees its own


class AgreeingDist:
    """torch.distributed where every other rank answers as this one did
    (setup_recording: no peer model, every all-reduce leaves its input)."""

    ReduceOp = FakeDist.ReduceOp

    @staticmethod
    def all_reduce(tensor, op=None, group=None):
        pass


def _peer_attempts_creation() -> None:
    """The peer enters the creation this rank enters, unless it has a
    workspace already; its first ``peer_fails`` attempts fail."""
    if not state["peer_has_workspace"]:
        state["peer_attempts"] += 1
        state["peer_has_workspace"] = state["peer_attempts"] > state["peer_fails"]


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


class _FakeTrtllmModule:
    """Stands in for FlashInfer's compiled trtllm comm module (the kernel)."""

    def trtllm_allreduce_fusion(self, **kw):
        import torch

        state["kernel_calls"].append(("trtllm", kw["token_num"], kw["hidden_dim"]))
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


class _FakeMnnvlModule:
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


def setup(tp: int = 2, capability: int = 90, backend: str = "trtllm") -> None:
    """Install the simulated device layer (see module docstring)."""
    os.environ["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] = backend
    from tpfix.replay import vllm_cpu_stubs

    vllm_cpu_stubs.register()  # torch.ops._C stand-ins, before any vLLM import

    # Import the vLLM modules used here while the platform is still the CPU
    # host's (their import-time kernel probes would need vllm._C); the device
    # is simulated from here on.
    import vllm.compilation.passes.fusion.allreduce_rms_fusion as arf
    import vllm.distributed.device_communicators.cuda_communicator  # noqa: F401
    import vllm.v1.spec_decode.draft_model  # noqa: F401
    import vllm.v1.worker.gpu_worker  # noqa: F401

    simulate_cuda_platform(capability)

    import flashinfer.comm as flashinfer_comm
    import flashinfer.comm.trtllm_ar as trtllm_ar
    import flashinfer.comm.trtllm_mnnvl_ar as trtllm_mnnvl_ar
    import vllm.distributed.parallel_state as ps

    ps._TP = None  # the worker's ensure_model_parallel_initialized makes it
    state["nodes"] = ps._NODE_COUNT = node_count(tp)

    def create(
        backend,
        world_size,
        rank,
        max_token_num,
        hidden_dim,
        dtype,
        gpus_per_node=None,
        comm_backend=None,
        force_oneshot_support=False,
        group=None,
        **_,
    ):
        state["attempts"] += 1
        _peer_attempts_creation()
        if state["capturing"]:  # every rank captures: the peer is refused too
            state["attempts_in_capture"] += 1
            state["peer_has_workspace"] = False
            raise RuntimeError(f"simulated: CUDA error: {CAPTURE_REFUSAL}")
        if state["local_fails"]:  # e.g. out of memory on this rank
            state["local_fails"] -= 1
            raise RuntimeError("simulated: CUDA out of memory")
        return make_workspace(
            backend, world_size, rank, max_token_num, hidden_dim, dtype, force_oneshot_support
        )

    flashinfer_comm.create_allreduce_fusion_workspace = create
    trtllm_ar.get_trtllm_comm_module = lambda: _FakeTrtllmModule()
    trtllm_mnnvl_ar.get_trtllm_mnnvl_comm_module = lambda: _FakeMnnvlModule()

    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    simulate_single_node(fiar)

    # The peer runs the same code: when this rank destroys the workspaces
    # (teardown, a replaced workspace, a pass's __del__), so does the peer.
    real_destroy = getattr(fiar.destroy_fi_ar_workspace, "__wrapped__", None)
    real_destroy = real_destroy or fiar.destroy_fi_ar_workspace

    def destroy_fi_ar_workspace():
        state["peer_has_workspace"] = False
        real_destroy()

    destroy_fi_ar_workspace.__wrapped__ = real_destroy
    fiar.destroy_fi_ar_workspace = destroy_fi_ar_workspace
    if hasattr(arf, "destroy_fi_ar_workspace"):  # the pass's __del__ (before 0003)
        arf.destroy_fi_ar_workspace = destroy_fi_ar_workspace
    state.update(
        created=[],
        kernel_calls=[],
        passes=[],
        tp=tp,
        capability=capability,
        backend=backend,
    )
    state.update(_process_counters())


def _process_counters() -> dict[str, Any]:
    """What one simulated worker process counts, as it starts."""
    return dict(
        destroyed=[],
        attempts=0,
        attempts_in_capture=0,
        collectives=0,
        local_fails=0,
        peer_fails=0,
        peer_attempts=0,
        peer_has_workspace=False,
        capturing=False,
    )


def forget_fi_ar_state(fiar) -> None:
    """flashinfer_all_reduce as a new process has it: no workspace, no planned
    shape, no failure latch (each where the tree under test has it)."""
    fiar.destroy_fi_ar_workspace()
    for name, value in (
        ("_fi_ar_workspace_failed", False),  # v0.33.0; v0.27.1 with its latch backport
        ("_fi_ar_quant_workspace_failed", False),
    ):
        if hasattr(fiar, name):
            setattr(fiar, name, value)


def new_process() -> None:
    """Simulate a fresh worker process: no workspace, no planned shape, no
    failure latch, no TP group (its worker makes one)."""
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar
    import vllm.distributed.parallel_state as ps

    state["passes"].clear()
    forget_fi_ar_state(fiar)
    ps._TP = None
    state["created"].clear()
    state["kernel_calls"].clear()
    state.update(_process_counters())


# --------------------------------------------------------------------------
# setup_recording(): FlashInfer's real constructors, recorded launches (bug_b)
# --------------------------------------------------------------------------
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
