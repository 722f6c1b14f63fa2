# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The simulated device under the replays: GPU, TP group, torch.distributed,
FlashInfer's GPU allocation and kernels.  Everything else the replays run is
the REAL code of the vLLM tree under test and of the FlashInfer it pins.

Two ways to install it, one per kind of replay: ``setup()`` here, and
``setup_recording()`` (bug_b's replays of the fused op, in
tpfix.replay.recorder, whose docstring lists what it simulates).  Both share
this module's platform, single node, collectives and capture flag, and
FlashInfer's sizing formulas (tpfix.replay.flashinfer_sim, which also holds
the workspace objects and CPU reference kernels ``setup()`` installs).

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
    everything FlashInfer does before the launch runs for real (the outputs
    of a fused call are compared with the reference on up to
    ``engine.CHECKED_ROWS`` rows spread over the batch: the op works row by
    row);
  * vLLM's ``torch.ops._C`` ops looked up at import: ``vllm_cpu_stubs``;
  * "a new process" (warm start) is simulated inside one interpreter by
    destroying the workspaces, forgetting the planned shape and the failure
    latches, and dropping the TP group;
  * a model loaded from the AOT compile cache (``engine.forward``): the fused
    ops of the compiled graph called with the arguments a first (cold) run's pass baked into
    them, without constructing a pass.
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


# --------------------------------------------------------------------------
# setup(): the simulated process (bug_a, the benchmarks)
# --------------------------------------------------------------------------
def import_host_modules(backend: str = "trtllm") -> None:
    """setup()'s first step, while the platform is still the CPU host's: the
    backend's variable, the ``torch.ops._C`` stand-ins (before any vLLM
    import), and the vLLM modules whose import-time kernel probes would need
    vllm._C.  Idempotent: an interpreter may run it ahead of its scenario
    (the preflight's do, while the serve line is parsed)."""
    os.environ["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] = backend
    from tpfix.replay import vllm_cpu_stubs

    vllm_cpu_stubs.register()
    import vllm.compilation.passes.fusion.allreduce_rms_fusion  # noqa: F401
    import vllm.distributed.device_communicators.cuda_communicator  # noqa: F401
    import vllm.v1.worker.gpu_worker  # noqa: F401

    try:  # the V1 model runner's drafter; V2's only (v0.34.0) is imported as used
        import vllm.v1.spec_decode.draft_model  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "vllm.v1.spec_decode.draft_model":
            raise


def setup(tp: int = 2, capability: int = 90, backend: str = "trtllm") -> None:
    """Install the simulated device layer (see module docstring)."""
    import_host_modules(backend)
    import vllm.compilation.passes.fusion.allreduce_rms_fusion as arf

    # (flashinfer_sim records into this module's `state`: imported here, not
    # at the top, where the two modules would import each other)
    from tpfix.replay.flashinfer_sim import FakeMnnvlModule, FakeTrtllmModule, make_workspace

    simulate_cuda_platform(capability)  # the device is simulated from here on

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
    trtllm_ar.get_trtllm_comm_module = lambda: FakeTrtllmModule()
    trtllm_mnnvl_ar.get_trtllm_mnnvl_comm_module = lambda: FakeMnnvlModule()

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
