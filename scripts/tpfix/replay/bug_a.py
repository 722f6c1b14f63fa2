# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug A scenarios (seed 000, issue 3): the FlashInfer all-reduce fusion
workspace under speculative decoding with TP > 1.

Each public function is a scenario that ``harness.run_scenario`` runs in a
fresh interpreter with ``PYTHONPATH=<vLLM tree>:<FlashInfer>:scripts``
and that returns a JSON-serialisable dict.  A scenario named by a patch
header's ``Scenario:`` field has its verdict ``check_<scenario>`` next to it
(replay.verdict).  The replays run on every tree of the series, on pristine
v0.27.1 and on v0.33.0 trees: what a tree lacks (the workspace plan, the
failure latches) is looked up with ``hasattr``.

What is REAL (taken from the vLLM tree under test and the installed FlashInfer):
  * vLLM's configuration: ``ModelConfig`` (from local ``config.json`` files, no
    weights), ``SpeculativeConfig``, ``VllmConfig.__post_init__`` (compile
    ranges, CUDA graph capture sizes and warm-up count as it sets them on a
    platform with static graph support, like CUDA), the drafter's
    configuration via ``DraftModelProposer._create_draft_vllm_config``;
  * the worker's ``init_worker_distributed_environment`` and
    ``Worker.load_model`` (gpu_worker.py; with the series it plans and
    creates the workspace through ``prepare_fi_ar_workspace``);
  * ``CudaCommunicator.destroy()`` of the TP group (``destroy_model_parallel``);
  * ``AllReduceFusionPass`` (sizing, workspace creation, pattern registration,
    ``is_applicable_for_range``), the custom op
    ``call_trtllm_fused_allreduce_norm`` and everything in
    ``flashinfer_all_reduce.py`` (plan, getters, creation, agreement,
    ``FlashInferAllReduce``);
  * FlashInfer's Python layer: ``allreduce_fusion`` dispatch,
    ``trtllm_allreduce_fusion`` / ``trtllm_mnnvl_*`` argument and workspace
    validation (``check_trtllm_allreduce_fusion_workspace_metadata``,
    ``is_buffer_size_sufficient``), ``MNNVLAllReduceFusionWorkspace``
    sizing helpers and thresholds.

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
    that torch.compile will compile (no real model is built; read by trees
    whose worker passes the loaded model to ``prepare_fi_ar_workspace``;
    later ones decide from the configuration);
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
  * a model loaded from the AOT compile cache: the fused ops of the compiled
    graph called with the arguments a first (cold) run's pass baked into
    them, without constructing a pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import types
from typing import Any

from tpfix.replay.verdict import by_exception

MiB = 1024 * 1024
SEED_MESSAGE = (
    "token_num (8192) * hidden_dim (2560) exceeds workspace max_token_num "
    "(8192) * hidden_dim (2048)"
)
# The two seed configurations (bug A's seed 000, bug B's seed 001).
SEED_000 = {
    "target_hidden": 2048,
    "draft_hidden": 2560,
    "tp": 2,
    "capability": 90,
    "max_num_batched_tokens": 8192,
    "backend": "trtllm",
}
SEED_001 = {
    "target_hidden": 6144,
    "draft_hidden": None,
    "tp": 8,
    "capability": 90,
    "max_num_batched_tokens": 8192,
    "backend": "mnnvl",
}
# creation_failure(**PEER_FAILS): this rank's creation succeeds, a peer's fails.
PEER_FAILS = {"where": "peer"}
# CUDA's refusal of an allocation on a capturing stream.
CAPTURE_REFUSAL = "operation not permitted when stream is capturing"

_MODEL_DIR = os.path.join(tempfile.gettempdir(), f"bug_a_models_{os.getuid()}")
_state: dict[str, Any] = {}


# --------------------------------------------------------------------------
# simulation layer
# --------------------------------------------------------------------------
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


def _ws_bytes(ws) -> int:
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
    from flashinfer.comm.mnnvl import SIGNAL_PAD_SIZE
    from flashinfer.comm.trtllm_mnnvl_ar import MNNVLAllReduceFusionWorkspace

    n = MNNVLAllReduceFusionWorkspace.NUM_LAMPORT_BUFFERS
    allocation = -(-(buffer_size_in_bytes * n + SIGNAL_PAD_SIZE) // granularity) * granularity
    return (allocation - SIGNAL_PAD_SIZE) // n // 16 * 16


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
    ws.destroy = lambda: _state["destroyed"].append(id(ws))
    _state["created"].append(
        {
            "backend": backend,
            "max_token_num": max_token_num,
            "hidden_dim": hidden_dim,
            "bytes": _ws_bytes(ws),
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
        _state["collectives"] += 1
        if not _state["peer_has_workspace"]:
            tensor.zero_()
        elif op == FakeDist.ReduceOp.MIN and not tensor.min().item():
            _state["peer_has_workspace"] = False  # the peer frees its own


def _peer_attempts_creation() -> None:
    """The peer enters the creation this rank enters, unless it has a
    workspace already; its first ``peer_fails`` attempts fail."""
    if not _state["peer_has_workspace"]:
        _state["peer_attempts"] += 1
        _state["peer_has_workspace"] = _state["peer_attempts"] > _state["peer_fails"]


def _reference_kernel(x, residual_in, gamma, eps, weight_bias, world_size):
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

        _state["kernel_calls"].append(("trtllm", kw["token_num"], kw["hidden_dim"]))
        n, h = kw["token_num"], kw["hidden_dim"]
        x = kw["allreduce_in"].view(n, h)
        res = kw.get("residual_in")
        res = res.view(n, h) if res is not None else None
        gamma = kw.get("rms_gamma")
        ar, s, normed = _reference_kernel(
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
        _state["kernel_calls"].append(("mnnvl", inp.shape[0], inp.shape[1]))
        ar, s, normed = _reference_kernel(
            inp, residual_in if rmsnorm else None, gamma, eps, weight_bias, tp_size
        )
        if not rmsnorm:
            output.copy_(ar)
            return
        output.copy_(normed)
        residual_out.copy_(s)

    def __getattr__(self, name):
        def kernel(*args, **kwargs):
            _state["kernel_calls"].append(("mnnvl:" + name, None, None))

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
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    current_platform.is_cuda = lambda: True
    current_platform.support_static_graph_mode = lambda: True
    current_platform.device_count = lambda: 8
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(
        capability // 10, capability % 10
    )

    import flashinfer.comm as flashinfer_comm
    import flashinfer.comm.trtllm_ar as trtllm_ar
    import flashinfer.comm.trtllm_mnnvl_ar as trtllm_mnnvl_ar
    import vllm.distributed.parallel_state as ps

    ps._TP = None  # the worker's ensure_model_parallel_initialized makes it
    ps._NODE_COUNT = 1

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
        _state["attempts"] += 1
        _peer_attempts_creation()
        if _state["capturing"]:  # every rank captures: the peer is refused too
            _state["attempts_in_capture"] += 1
            _state["peer_has_workspace"] = False
            raise RuntimeError(f"simulated: CUDA error: {CAPTURE_REFUSAL}")
        if _state["local_fails"]:  # e.g. out of memory on this rank
            _state["local_fails"] -= 1
            raise RuntimeError("simulated: CUDA out of memory")
        return make_workspace(
            backend, world_size, rank, max_token_num, hidden_dim, dtype, force_oneshot_support
        )

    flashinfer_comm.create_allreduce_fusion_workspace = create
    trtllm_ar.get_trtllm_comm_module = lambda: _FakeTrtllmModule()
    trtllm_mnnvl_ar.get_trtllm_mnnvl_comm_module = lambda: _FakeMnnvlModule()

    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    fiar.TorchDistBackend = lambda group=None: None
    if hasattr(fiar, "_node_count"):  # v0.33.0+: a single node is simulated
        fiar._node_count = lambda group: 1
    fiar.dist = FakeDist

    # The peer runs the same code: when this rank destroys the workspaces
    # (teardown, a replaced workspace, a pass's __del__), so does the peer.
    real_destroy = getattr(fiar.destroy_fi_ar_workspace, "__wrapped__", None)
    real_destroy = real_destroy or fiar.destroy_fi_ar_workspace

    def destroy_fi_ar_workspace():
        _state["peer_has_workspace"] = False
        real_destroy()

    destroy_fi_ar_workspace.__wrapped__ = real_destroy
    fiar.destroy_fi_ar_workspace = destroy_fi_ar_workspace
    if hasattr(arf, "destroy_fi_ar_workspace"):  # the pass's __del__ (before 0003)
        arf.destroy_fi_ar_workspace = destroy_fi_ar_workspace
    import torch

    torch.cuda.is_current_stream_capturing = lambda: _state["capturing"]
    _state.update(
        created=[],
        kernel_calls=[],
        passes=[],
        tp=tp,
        capability=capability,
        backend=backend,
    )
    _state.update(_process_counters())


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
        ("_fi_ar_workspace_shape", None),  # patch 0002
        ("_fi_ar_workspace_failed", False),  # patch 0004, v0.33.0
        ("_fi_ar_quant_workspace_failed", False),
    ):
        if hasattr(fiar, name):
            setattr(fiar, name, value)


def new_process() -> None:
    """Simulate a fresh worker process: no workspace, no planned shape, no
    failure latch, no TP group (its worker makes one)."""
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar
    import vllm.distributed.parallel_state as ps

    _state["passes"].clear()
    forget_fi_ar_state(fiar)
    ps._TP = None
    _state["created"].clear()
    _state["kernel_calls"].clear()
    _state.update(_process_counters())


# --------------------------------------------------------------------------
# engine pieces (real vLLM code)
# --------------------------------------------------------------------------
def engine_config(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    max_num_batched_tokens=8192,
    dtype="bfloat16",
    spec_method="draft_model",
):
    """The engine's VllmConfig, as ``vllm serve`` would build it."""
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
    pc = ParallelConfig(tensor_parallel_size=tp)
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
        compilation_config=CompilationConfig(pass_config={"fuse_allreduce_rms": True}),
    )


def draft_config(vllm_config):
    """The drafter's VllmConfig, from DraftModelProposer's own code."""
    from vllm.v1.spec_decode.draft_model import DraftModelProposer

    proposer = DraftModelProposer.__new__(DraftModelProposer)
    proposer.vllm_config = vllm_config
    proposer.speculative_config = vllm_config.speculative_config
    return proposer._create_draft_vllm_config()


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
        ps._NODE_COUNT = 1

    def ensure_mp(*args, **kwargs):
        if ps._TP is not None:  # kept from an earlier engine of this process
            assert ps._TP.world_size == tp, "the TP group has another size"
            return
        ps._TP = FakeTPGroup(tp)
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
    the model runner (its ``load_model`` loads nothing, ``get_model()`` is
    ``model_stand_in()``), and the CUDA allocator settings and
    sleep mode memory pool it scopes (no-ops)."""
    from vllm.v1.worker.gpu_worker import Worker

    model = model_stand_in(compiled)
    worker = Worker.__new__(Worker)
    worker.vllm_config = vllm_config
    worker.model_runner = types.SimpleNamespace(
        load_model=lambda **kwargs: None, get_model=lambda: model
    )
    worker._scoped_allocator_max_split = lambda **kwargs: contextlib.nullcontext()
    worker._maybe_get_memory_pool_context = lambda tag: contextlib.nullcontext()
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
    _state["passes"].append(fpass)
    return fpass


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
    g = torch.Generator().manual_seed(num_tokens * 7 + h)
    x = torch.randn(num_tokens, h, generator=g).to(dt)
    res = torch.randn(num_tokens, h, generator=g).to(dt)
    gamma = torch.randn(h, generator=g).to(dt)
    x0, res0 = x.clone(), res.clone()
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
    _, s_ref, n_ref = _reference_kernel(x0, res0, gamma, 1e-6, weight_bias, _state["tp"])
    err = max(
        (x.float() - n_ref.to(dt).float()).abs().max().item(),
        (res.float() - s_ref.to(dt).float()).abs().max().item(),
    )
    out = {"fused": True, "max_abs_err": err}
    if quant_out is not None:
        m = torch.finfo(torch.float8_e4m3fn).max
        q_ref = (n_ref.to(dt).float() / 0.05).clamp(-m, m).to(torch.float8_e4m3fn)
        out["quant_max_abs_err"] = (quant_out.float() - q_ref.float()).abs().max().item()
    return out


def token_counts(plan, max_num_batched_tokens) -> list[int]:
    """Token counts a compiled graph may send to its fused sites: one token,
    the largest fused compile-range end, and the profile run's batch."""
    ends = [r[1] for r in plan["fused_ranges"]]
    return sorted({1, max_num_batched_tokens, *ends[-1:]})


def forward_all(plan, max_num_batched_tokens, pattern="kARResidualRMSNorm"):
    return {str(n): forward(plan, n, pattern) for n in token_counts(plan, max_num_batched_tokens)}


def _workspaces() -> dict:
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
                "bytes": _ws_bytes(ws),
            }
        else:
            out[name] = {
                "backend": "mnnvl",
                "buffer_size_bytes": ws.buffer_size_bytes,
                "bytes": _ws_bytes(ws),
            }
    return out


def _kernel_calls():
    return [list(c) for c in _state["kernel_calls"]]


# --------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------
def cold_start(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    pattern="kARResidualRMSNorm",
):
    """Seed config, empty compile cache: the worker starts, the compiler builds
    the target's fusion pass, then the drafter's, then the profile run sends
    ``max_num_batched_tokens`` tokens through target and drafter."""
    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}
    dcfg = None
    if draft_hidden is not None:
        dcfg = draft_config(cfg)
        plans["draft"] = compile_plan(dcfg, fusion_pass(dcfg))
    results = {}
    for name, plan in plans.items():
        results[name] = forward_all(plan, max_num_batched_tokens, pattern)
    covers = {
        "target": fusion_covers_budget(cfg, plans["target"]),
    }
    if dcfg is not None:
        covers["draft"] = fusion_covers_budget(dcfg, plans["draft"])
    return {
        "plans": plans,
        "forward": results,
        "workspaces": _workspaces(),
        "created": list(_state["created"]),
        "kernel_calls": _kernel_calls(),
        "fusion_covers_budget": covers,
    }


def warm_start(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    target_pattern="kARResidualRMSNorm",
    draft_pattern="kARResidualRMSNorm",
):
    """Warm AOT compile cache: a first run compiled both models (passes built,
    fused ops baked with the pass's ``max_token_num``); then a new process
    loads both graphs from the cache, so no pass is constructed: the worker
    creates the workspace when it loads the models (patch 0002 on), or else
    the target's compiled op creates it lazily with its own tensors."""
    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    # first (cold) run, which filled the cache
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}
    if draft_hidden is not None:
        plans["draft"] = compile_plan(draft_config(cfg), fusion_pass(draft_config(cfg)))
    # second run: new process, graphs come from the AOT cache
    new_process()
    worker_init(cfg)
    results = {"target": forward_all(plans["target"], max_num_batched_tokens, target_pattern)}
    if draft_hidden is not None:
        results["draft"] = forward_all(plans["draft"], max_num_batched_tokens, draft_pattern)
    return {
        "plans": plans,
        "forward": results,
        "workspaces": _workspaces(),
        "created": list(_state["created"]),
        "kernel_calls": _kernel_calls(),
    }


# FlashInfer's validation of a request against a workspace too small for it
_TOO_SMALL = (
    "exceeds workspace max_token_num",  # trtllm
    "buffer size in the given workspace is insufficient",  # mnnvl
)


def _ran_fused(result: dict) -> bool:
    """Every model of ``result["forward"]`` sent some token count to FlashInfer,
    and every fused call matched the unfused reference."""
    for sent in result.get("forward", {}).values():
        fused = [v for v in sent.values() if v.get("fused")]
        if not fused or any(v["max_abs_err"] != 0.0 for v in fused):
            return False
    return True


def check_warm_start(result: dict) -> bool | None:
    """Fixed: both models load and run fused (no error, exact results); the
    bug: FlashInfer's workspace validation rejects the wider model
    (ValueError "exceeds workspace max_token_num" from trtllm, "buffer size
    in the given workspace is insufficient" from MNNVL)."""
    for message in _TOO_SMALL:
        verdict = by_exception(result, "ValueError", message, _ran_fused)
        if verdict is not None:
            return verdict
    return None


def warm_start_capture_order(
    target_hidden=2048,
    draft_hidden=2560,
    tp=2,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
    num_warmups=None,
):
    """Warm start (new process, graphs from the AOT cache: no pass is built)
    in vLLM's start order: the profile run at ``max_num_batched_tokens``
    (target, then drafter), then CUDA graph capture of the config's
    ``cudagraph_capture_sizes`` from the largest to the smallest, each size
    (target, then drafter) after ``num_warmups`` eager runs, with
    ``_state["capturing"]`` set during the capture (allocation is refused
    there).  ``num_warmups=None``: the config's ``cudagraph_num_of_warmups``
    as ``VllmConfig`` sets it on a platform with static graph support (1
    unless enforce_eager, v0.27.1 ``vllm/config/vllm.py:1432``; the
    CompilationConfig field's default is 0).  The first error stops the
    start; ``at`` says where."""
    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    cc = cfg.compilation_config
    warmups = cc.cudagraph_num_of_warmups if num_warmups is None else num_warmups
    sizes = sorted(cc.cudagraph_capture_sizes or [], reverse=True)
    # the first (cold) run compiled both models and filled the AOT cache
    worker_init(cfg)
    plans = {"target": compile_plan(cfg, fusion_pass(cfg))}
    if draft_hidden is not None:
        dcfg = draft_config(cfg)
        plans["draft"] = compile_plan(dcfg, fusion_pass(dcfg))
    new_process()
    worker_init(cfg)  # the graphs come from the AOT cache: no pass
    steps = [("profile", max_num_batched_tokens)]
    for n in sizes:
        steps += [("warmup", n)] * warmups + [("capture", n)]
    out: dict[str, Any] = {
        "cudagraph_mode": str(cc.cudagraph_mode),
        "config_num_warmups": cc.cudagraph_num_of_warmups,
        "num_warmups": warmups,
        "capture_sizes": {"count": len(sizes), "largest": sizes[0] if sizes else None},
        "fused_ranges": {k: p["fused_ranges"] for k, p in plans.items()},
    }
    calls = {"fused": 0, "unfused": 0}
    first_fused, max_err, at = None, 0.0, None
    try:
        for phase, n in steps:
            for model, plan in plans.items():
                at = f"{phase}:{model}:{n}"
                _state["capturing"] = phase == "capture"
                try:
                    res = forward(plan, n)
                finally:
                    _state["capturing"] = False
                if res["fused"]:
                    calls["fused"] += 1
                    first_fused = first_fused or at
                    max_err = max(max_err, res["max_abs_err"])
                else:
                    calls["unfused"] += 1
    except Exception as e:  # noqa: BLE001  (reported like the harness does)
        out.update(error=type(e).__name__, message=str(e)[:500], at=at)
    out.update(
        calls=calls,
        first_fused=first_fused,
        max_abs_err=max_err,
        attempts_in_capture=_state["attempts_in_capture"],
        created=list(_state["created"]),
        workspaces=_workspaces(),
    )
    return out


_START_BUGS = (
    *(("ValueError", m) for m in _TOO_SMALL),  # a too small workspace
    ("AssertionError", "workspace must be initialized"),  # creation failed
    ("RuntimeError", CAPTURE_REFUSAL),
)


def check_warm_start_capture_order(result: dict) -> bool | None:
    """Fixed: the whole start runs, fused calls among it, all exact, and no
    creation was attempted inside a capture; the bug: the start dies of a
    workspace that is too small or was not created (refused in capture)."""
    if "error" in result:
        bug = any(result["error"] == e and m in result.get("message", "") for e, m in _START_BUGS)
        return False if bug else None
    return (
        result["calls"]["fused"] > 0
        and result["max_abs_err"] == 0.0
        and result["attempts_in_capture"] == 0
    )


def standalone(
    target_hidden=2048,
    draft_hidden=2560,
    tp=4,
    capability=90,
    max_num_batched_tokens=8192,
    backend="trtllm",
):
    """FlashInferAllReduce (VLLM_ALLREDUCE_USE_FLASHINFER=1), constructed with
    the TP group before the models are loaded: target tensors first, then
    the drafter's, at token counts around the limits FlashInferAllReduce may
    accept for each width (each accepted tensor goes to FlashInfer).
    Tensors are CPU tensors presented as CUDA (simulated)."""
    import torch
    import vllm.distributed.parallel_state as ps

    setup(tp, capability, backend)
    cfg = engine_config(target_hidden, draft_hidden, tp, max_num_batched_tokens)
    worker_init(cfg, standalone=True)
    comm = ps._TP.device_communicator.fi_ar_comm
    created_at_load = len(_state["created"])

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
        "workspaces": _workspaces(),
        "kernel_calls": _kernel_calls(),
    }


def fiar_group():
    import vllm.distributed.parallel_state as ps

    return ps._TP.cpu_group


def tp_budget_elems(cfg) -> int:
    pc = cfg.compilation_config.pass_config
    return pc.flashinfer_max_size(cfg.parallel_config.tensor_parallel_size) // 2


def _fused_call(plan, n=1) -> dict:
    """One call of a compiled graph's fused op; an exception is reported."""
    try:
        return forward(plan, n)
    except Exception as e:  # noqa: BLE001
        return {"error": type(e).__name__, "message": str(e)[:300]}


def _ranks(fiar) -> dict:
    return {
        "attempts": _state["attempts"],
        "workspace": fiar._fi_ar_workspace is not None,
        "peer_workspace": _state["peer_has_workspace"],
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
    _state[fails] = 1
    worker_init(cfg)
    passes = [fusion_pass(cfg), fusion_pass(draft_config(cfg))]
    out["cold"] = {**_ranks(fiar), "fusion_enabled": [not p.disabled for p in passes]}
    new_process()
    _state[fails] = 1
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
    captured (``_state["capturing"]``, where the simulated allocation is
    refused).  Creating there would allocate and run a collective inside the
    capture."""
    setup(tp, capability, backend)
    cfg = engine_config(2048, 2560, tp, 8192)
    worker_init(cfg)
    plan = compile_plan(cfg, fusion_pass(cfg))
    new_process()
    worker_init(cfg)
    collectives = _state["collectives"]
    _state["capturing"] = True
    try:
        call = _fused_call(plan)
    finally:
        _state["capturing"] = False
    return {
        "call": call,
        "attempts_in_capture": _state["attempts_in_capture"],
        "collectives_in_capture": _state["collectives"] - collectives,
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
    _state["passes"].remove(draft_pass)
    del draft_pass
    gc.collect()
    alive = fiar._fi_ar_workspace is not None
    forward = forward_all(target_plan, 8192)
    return {
        "destroyed": len(_state["destroyed"]),
        "alive_after_gc": alive,
        "created": list(_state["created"]),
        "forward": {"target": forward},
        "kernel_calls": _kernel_calls(),
    }


def check_drafter_pass_collected(result: dict) -> bool | None:
    """Fixed: the workspace outlives the drafter's pass (not destroyed, not
    created again) and the target's calls run fused and exact; the bug: the
    pass's collection destroyed it (and the next call made another)."""
    if "error" in result:
        return None
    if result["destroyed"] or not result["alive_after_gc"] or len(result["created"]) != 1:
        return False
    return _ran_fused(result)


def teardown_tp_group() -> None:
    """What destroy_model_parallel() does to the TP group: the REAL
    ``CudaCommunicator.destroy()`` of its device communicator (unique_name
    "tp:0"; its NCCL, custom all-reduce and all2all members are absent in
    this simulation), then the group is gone."""
    import vllm.distributed.parallel_state as ps

    ps._TP.device_communicator.destroy()
    ps._TP = None


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
    _state["local_fails"] = 1 if first_fails else 0
    worker_init(cfg1)
    plan1 = compile_plan(cfg1, fusion_pass(cfg1))
    first = forward_all(plan1, 8192) if plan1["fused_ranges"] else {}
    first_attempts = _state["attempts"]
    if teardown:
        teardown_tp_group()
    destroyed = len(_state["destroyed"])
    _state["created"].clear()
    _state["kernel_calls"].clear()
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
        "created": list(_state["created"]),
        "workspaces": _workspaces(),
        "kernel_calls": _kernel_calls(),
    }


def suite_cases() -> dict[str, tuple[Any, dict]]:
    """The named cases of ``suite``: name -> (scenario function, kwargs)."""
    return {
        "cold_seed": (cold_start, {}),
        "warm_seed": (warm_start, {}),
        "cold_quant_fp8": (cold_start, {"pattern": "kARResidualRMSNormFP8Quant"}),
        "warm_quant_first": (
            warm_start,
            {"target_pattern": "kARResidualRMSNormFP8Quant"},
        ),
        "cold_narrow_draft": (cold_start, {"target_hidden": 4096, "draft_hidden": 2048}),
        "warm_narrow_draft": (warm_start, {"target_hidden": 4096, "draft_hidden": 2048}),
        "cold_equal": (cold_start, {"target_hidden": 2048, "draft_hidden": 2048}),
        "warm_equal": (warm_start, {"target_hidden": 2048, "draft_hidden": 2048}),
        "cold_no_spec": (cold_start, {"draft_hidden": None}),
        "warm_no_spec": (warm_start, {"draft_hidden": None}),
        "cold_tp4_budget": (cold_start, {"tp": 4}),
        "warm_mnnvl_sm100": (warm_start, {"backend": "mnnvl", "capability": 100, "tp": 4}),
        "capture_order_seed_000": (warm_start_capture_order, SEED_000),
        "capture_order_seed_000_no_warmup": (
            warm_start_capture_order,
            {**SEED_000, "num_warmups": 0},
        ),
        "capture_order_seed_001": (warm_start_capture_order, SEED_001),
        "capture_order_seed_001_no_warmup": (
            warm_start_capture_order,
            {**SEED_001, "num_warmups": 0},
        ),
        "cold_seed_001": (cold_start, SEED_001),
        "standalone_tp4": (standalone, {}),
        "fail_local": (creation_failure, {"where": "local"}),
        "fail_peer": (creation_failure, PEER_FAILS),
        "fail_local_mnnvl": (creation_failure, {"where": "local", "backend": "mnnvl"}),
        "fail_peer_mnnvl": (creation_failure, {**PEER_FAILS, "backend": "mnnvl"}),
        "capture_first_use": (capture_first_use, {}),
        "drafter_collected": (drafter_pass_collected, {}),
        "two_engines": (two_engines, {}),
        "two_engines_first_failed": (two_engines, {"first_fails": True}),
        "two_engines_no_teardown": (two_engines, {"teardown": False}),
        "two_engines_no_teardown_narrower": (
            two_engines,
            {"teardown": False, "second_hidden": 1024},
        ),
    }


def suite(names: list[str] | None = None) -> dict:
    """Run the named cases of ``suite_cases`` (all, or those in ``names``) in
    this one interpreter, each in a simulated new process; an exception is
    reported as {"error", "message"}."""
    out = {}
    for name, (fn, kwargs) in suite_cases().items():
        if names is not None and name not in names:
            continue
        try:
            out[name] = fn(**kwargs)
        except Exception as e:  # reported, like the harness does
            out[name] = {"error": type(e).__name__, "message": str(e)}
        finally:
            with contextlib.suppress(Exception):
                new_process()
    return out


# --------------------------------------------------------------------------
# property: every shape the compiled graphs may send fits the workspace
# --------------------------------------------------------------------------
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
    bytes_ = _ws_bytes(fiar._fi_ar_workspace) if fiar._fi_ar_workspace else 0
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


# --------------------------------------------------------------------------
# measurement (scripts/tpfix/bench/workspace.py)
# --------------------------------------------------------------------------
def _all_workspace_bytes() -> int:
    import vllm.distributed.device_communicators.flashinfer_all_reduce as fiar

    seen, total = set(), 0
    for ws in (fiar._fi_ar_workspace, fiar._fi_ar_quant_workspace):
        if ws is not None and id(ws) not in seen:
            seen.add(id(ws))
            total += _ws_bytes(ws)
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
    FlashInfer's AUTO choice for every request (what v0.27.1 requests on
    MNNVL; patch 0005 requests two-shot where that does not fit)."""
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
    SIMULATED as in the module docstring, and here also: pattern
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
        _state["created"].pop()
        if all(fits(ws, n, h, tp, torch.bfloat16) for n, h in need):
            hi = mid
        else:
            lo = mid + 1
    ws = make_workspace(backend, tp, 0, lo, hidden, torch.bfloat16)
    _state["created"].pop()
    return _ws_bytes(ws)


# --------------------------------------------------------------------------
# measurement (scripts/tpfix/bench/fused_op.py): the fused op's own Python cost
# --------------------------------------------------------------------------
def op_overhead(backend="trtllm", calls=20000, repeats=7, num_tokens=8, hidden=2048) -> dict:
    """Seconds per call of the REAL ``call_trtllm_fused_allreduce_norm`` body
    (workspace lookup, one-shot selection, argument handling), best of
    ``repeats`` runs of ``calls`` calls.  FlashInfer's ``allreduce_fusion``
    is replaced by a no-op so that only vLLM's code is timed; the workspace
    is the engine's (simulated as in the module docstring)."""
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
    kwargs = dict(
        allreduce_in=x,
        residual=res,
        rms_gamma=gamma,
        rms_eps=1e-6,
        pattern_code=code,
        **plan["op_kwargs"],
    )
    op = arf.call_trtllm_fused_allreduce_norm
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            op(**kwargs)
        best = min(best, (time.perf_counter() - t0) / calls)
    return {"backend": backend, "seconds_per_call": best, "calls": calls, "repeats": repeats}
