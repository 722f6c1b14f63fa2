# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Bug B (seed 001): one-shot all-reduce threshold in two different units,
and a request that does not fit a workspace shared by models of different
widths.

Scenarios run in a fresh interpreter with ``PYTHONPATH=<vLLM tree>:<FlashInfer>:
scripts`` (see ``scripts/tpfix/replay/harness.py``).  They drive the REAL vLLM code of
the tree under test (the compiled custom op ``call_trtllm_fused_allreduce_norm``
and, in ``flashinfer_all_reduce``, the creation at load
``init_fi_ar_fusion_workspace`` where the tree has it, the getters and the
creation) on top of the REAL
FlashInfer 0.6.16.post4 Python code (``allreduce_fusion``, the workspace
classes, their size checks, ``MNNVL_ONE_SHOT_THRESHOLD``,
``MNNVLAllReduceFusionWorkspace.get_required_buffer_size_bytes``).

What is simulated, and only that (there is no GPU here), is the device
layer ``recorder.setup_recording()`` installs (scripts/tpfix/replay/recorder.py,
its docstring lists it): GPU memory (FlashInfer's real constructors on a
simulated multicast allocation, at the MNNVL allocation ``granularity`` of
the case: default 1, the smallest buffer FlashInfer can end up with), the
TRT-LLM IPC allocation (same metadata formulas as trtllm_ar.py), kernel
launches (recorders of ``use_oneshot``), the TP group (rank 0; the other
ranks agree to every creation; no CUDA graph is captured) and the device
(``is_cuda()``, the case's SM capability).  Also simulated here:

* ``tensor_model_parallel_all_reduce`` raises, and the case counts an
  "unfused" call instead of a kernel launch (no tree of the series falls
  back to it; the count must stay 0).
* The engine as ``init_fi_ar_fusion_workspace`` sees it when the worker
  has loaded the models (the series' sizing patch on): a configuration
  object carrying only the fields it reads (target and draft width, a draft
  model as the drafter, dtype, ``max_num_batched_tokens``, compilation mode
  VLLM_COMPILE, a real ``PassConfig`` with the fusion on).  On trees
  without it (pristine) the first op call creates the workspace with its
  own shape, as there.
* vLLM's compiled ``torch.ops._C`` ops looked up at import: ``vllm_cpu_stubs``.
"""

from __future__ import annotations

import os
import types
from typing import Any

from tpfix.replay.device import forget_fi_ar_state, simulate_cuda_platform
from tpfix.replay.recorder import recording, setup_recording

# A draft narrower than the target on MNNVL (TP8 SM90, 6144 planned, 4096-wide
# tensors, 1..16 tokens): FlashInfer reserves one-shot in whole rows of the
# planned width, so AUTO can pick one-shot beyond the buffer (at allocation
# granularity 1; see MIB2).  Used by tests/test_bug_b.py: no patch of the
# series changes it (FlashInfer's AUTO decides on MNNVL), and with a 2 MiB
# granularity it fits.
NARROW_DRAFT = {
    "backend": "mnnvl",
    "capability": 90,
    "tp": 8,
    "widths": [6144, 4096],
    "dtype": "bfloat16",
    "limit": 16,
    "budget_mb": None,
}

MiB = 1024 * 1024
# A 2 MiB allocation granularity, to set against the default of 1.
MIB2 = 2 * MiB


# --------------------------------------------------------------------------
# One case: configure, plan/create the workspace the tree's way, call the op
# --------------------------------------------------------------------------
def torch_dtype(name: str):
    """The torch dtype named `name` (bfloat16, float16 or float32)."""
    import torch

    assert name in ("bfloat16", "float16", "float32"), name
    return getattr(torch, name)


def _configure(backend: str, capability: int, granularity: int = 1) -> dict[str, Any]:
    st = setup_recording()
    os.environ["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] = backend
    vfi = st["vfi"]
    forget_fi_ar_state(vfi)
    st["granularity"] = granularity
    simulate_cuda_platform(capability, static_graphs=False)
    st["launches"].clear()
    st["allocations"].clear()
    return st


class _Unfused(Exception):
    """Raised by the stand-in for the unfused all-reduce (no TP group here)."""


def _plan(tp: int, widths: list[int], dtype, limit: int, budget_mb: float | None):
    """Create the workspace the tree's way.

    Returns ``(per-width max_token_num passed to the op, the workspace shape
    created at load or None)``.  Each model's pass bakes its own
    ``max_token_num`` (the pass formula at its own width).  With the series
    the worker, once the models are loaded, calls the REAL
    ``init_fi_ar_fusion_workspace`` with the engine (module docstring), which
    creates the workspace in the shape of ``fi_ar_workspace_shape``; without
    it (pristine) the first op call creates it with its own shape.
    """
    vfi = recording["vfi"]
    from vllm.config.compilation import PassConfig

    pass_config = PassConfig(fuse_allreduce_rms=True, fi_allreduce_fusion_max_size_mb=budget_mb)
    max_size = pass_config.flashinfer_max_size(tp)
    if max_size is None:
        return None, None
    per_width = {h: min(max_size // (h * dtype.itemsize), limit) for h in widths}
    recording["tp_group"].world_size = tp
    if not hasattr(vfi, "init_fi_ar_fusion_workspace"):
        return per_width, None

    from vllm.config import CompilationMode

    def _model(h):
        return types.SimpleNamespace(get_hidden_size=lambda: h, dtype=dtype)

    target = _model(widths[0])
    spec = None
    if len(widths) > 1:
        spec = types.SimpleNamespace(
            target_model_config=target,
            draft_model_config=_model(widths[1]),
            uses_draft_model=lambda: True,  # a draft model (method="draft_model")
        )
    cfg = types.SimpleNamespace(
        model_config=target,
        speculative_config=spec,
        compilation_config=types.SimpleNamespace(
            mode=CompilationMode.VLLM_COMPILE, pass_config=pass_config
        ),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=limit),
    )
    vfi.init_fi_ar_fusion_workspace(cfg)  # the worker's call
    return per_width, list(vfi.fi_ar_workspace_shape(cfg, max_size, tp))


def _required_and_allocated(workspace, tp, n, h, dtype, use_oneshot):
    """(required, allocated) bytes of the launched strategy, FlashInfer's way."""
    fi_mnnvl = recording["fi_mnnvl"]
    if workspace.backend == "mnnvl":
        strategy = fi_mnnvl.MNNVLAllreduceFusionStrategy
        required = fi_mnnvl.MNNVLAllReduceFusionWorkspace.get_required_buffer_size_bytes(
            tp, n, h, dtype, strategy.ONESHOT if use_oneshot else strategy.TWOSHOT
        )
        return required, workspace.buffer_size_bytes
    md = workspace.metadata
    lamport_elem = 4 if md["use_fp32_lamport"] else 2
    if use_oneshot:
        # one-shot writes every peer's tensor into the Lamport buffer
        return n * h * tp * lamport_elem, md["lamport_comm_size"]
    # FlashInfer's only size check for TRT-LLM (token_num * hidden_dim)
    return n * h * lamport_elem, md["max_token_num"] * md["hidden_dim"] * lamport_elem


def workspace_bytes_per_rank(workspace) -> int:
    """GPU memory of one workspace on one rank: TRT-LLM as requested from the
    allocator; MNNVL its 3 usable Lamport buffers (the allocation adds the
    signal pad and the granularity's round-up)."""
    if workspace.backend == "mnnvl":
        return workspace.buffer_size_bytes * workspace.NUM_LAMPORT_BUFFERS
    md = workspace.metadata
    return md["buffer_size"] + md["flag_size"] + md["lamport_buffer_size"]


def _tree_abstains_on_mnnvl() -> bool:
    """True for trees whose selection returns None on MNNVL (vllm#47589)."""
    import inspect

    select = recording["arf"]._select_flashinfer_allreduce_use_oneshot
    if list(inspect.signature(select).parameters)[0] != "workspace_backend":
        return False
    return select("mnnvl", 90, 8, 1) is None


def _apply_vllm_table_on_mnnvl(enable: bool) -> bool:
    """Make a tree that abstains on MNNVL apply its own one-shot table there, as
    vLLM did before vllm#47589 (and as it does on TRT-LLM).  Returns whether
    the tree needed it.  Trees that decide on MNNVL themselves are untouched.
    """
    arf = recording["arf"]
    original = recording.setdefault("select_original", arf._select_flashinfer_allreduce_use_oneshot)
    arf._select_flashinfer_allreduce_use_oneshot = original
    if not enable or not _tree_abstains_on_mnnvl():
        return False

    def select_with_vllm_table(backend, *args):
        use_oneshot = original(backend, *args)
        return original("trtllm", *args) if use_oneshot is None else use_oneshot

    arf._select_flashinfer_allreduce_use_oneshot = select_with_vllm_table
    return True


def run_case(
    backend: str,
    capability: int,
    tp: int,
    widths: list[int],
    dtype: str,
    limit: int,
    budget_mb: float | None = None,
    token_counts: list[int] | None = None,
    vllm_table_on_mnnvl: bool = False,
    max_failures: int = 3,
    granularity: int = 1,
) -> dict[str, Any]:
    """Plan, create and use the workspace through the tree's real code.

    For every model width and token count N the real compiled op
    ``call_trtllm_fused_allreduce_norm`` is called; FlashInfer's real
    ``allreduce_fusion`` resolves the strategy and runs its checks; the
    recorded launch is compared with the allocation (FlashInfer's formulas).
    ``granularity``: the simulated MNNVL allocation granularity (module
    docstring).
    """
    st = _configure(backend, capability, granularity)
    torch = st["torch"]
    arf, vfi = st["arf"], st["vfi"]
    tdtype = torch_dtype(dtype)
    forced = _apply_vllm_table_on_mnnvl(vllm_table_on_mnnvl and backend == "mnnvl")
    per_width_max, shape = _plan(tp, widths, tdtype, limit, budget_mb)
    out: dict[str, Any] = {
        "backend": backend,
        "capability": capability,
        "tp": tp,
        "widths": widths,
        "dtype": dtype,
        "limit": limit,
        "budget_mb": budget_mb,
        "vllm_table_forced_on_mnnvl": forced,
        "granularity": granularity,
        "planned_shape": shape,
    }
    if per_width_max is None:
        out["fusion"] = "unsupported"
        return out

    def _unfused(*a, **k):
        raise _Unfused()

    arf.tensor_model_parallel_all_reduce = _unfused
    pattern = arf.flashinfer_comm.AllReduceFusionPattern.kARResidualRMSNorm
    checked = failures = unfused = 0
    examples: list[dict[str, Any]] = []
    oneshot_ns: dict[int, list[int]] = {}
    twoshot_ns: dict[int, list[int]] = {}
    for h in widths:
        max_tokens = per_width_max[h]
        ns = token_counts or range(1, max_tokens + 1)
        gamma = torch.ones(h, dtype=tdtype)
        oneshot_ns[h], twoshot_ns[h] = [], []
        for n in ns:
            if n > max_tokens:
                continue
            x = torch.empty((n, h), dtype=tdtype)
            st["launches"].clear()
            checked += 1
            try:
                arf.call_trtllm_fused_allreduce_norm(
                    allreduce_in=x,
                    residual=torch.empty_like(x),
                    rms_gamma=gamma,
                    rms_eps=1e-6,
                    world_size=tp,
                    launch_with_pdl=True,
                    fp32_acc=True,
                    max_token_num=max_tokens,
                    pattern_code=pattern,
                    norm_out=torch.empty_like(x),
                )
            except _Unfused:
                unfused += 1
                continue
            except (ValueError, AssertionError) as e:
                failures += 1
                if len(examples) < max_failures:
                    examples.append(
                        {"hidden": h, "num_tokens": n, "error": f"{type(e).__name__}: {e}"}
                    )
                continue
            launch = st["launches"][-1]
            workspace = vfi._fi_ar_workspace
            required, allocated = _required_and_allocated(
                workspace, tp, n, h, tdtype, launch["use_oneshot"]
            )
            (oneshot_ns if launch["use_oneshot"] else twoshot_ns)[h].append(n)
            if required > allocated:
                failures += 1
                if len(examples) < max_failures:
                    examples.append(
                        {
                            "hidden": h,
                            "num_tokens": n,
                            "use_oneshot": launch["use_oneshot"],
                            "required": required,
                            "allocated": allocated,
                        }
                    )
    workspace = vfi._fi_ar_workspace
    out.update(
        max_token_num=per_width_max,
        checked=checked,
        failures=failures,
        unfused=unfused,
        failure_examples=examples,
        workspace_backend=None if workspace is None else workspace.backend,
        workspace_bytes_per_rank=(
            None if workspace is None else workspace_bytes_per_rank(workspace)
        ),
        mnnvl_buffer_size_bytes=getattr(workspace, "buffer_size_bytes", None),
        oneshot_tokens={h: value_ranges(v) for h, v in oneshot_ns.items()},
        twoshot_tokens={h: value_ranges(v) for h, v in twoshot_ns.items()},
    )
    return out


def run_case_at(granularities: list[int], **case: Any) -> dict[str, dict[str, Any]]:
    """``run_case(**case)`` at each simulated MNNVL allocation granularity, in
    this one interpreter: {str(granularity): result}."""
    return {str(g): run_case(**case, granularity=g) for g in granularities}


def check_run_case(result: dict) -> bool | None:
    """Fixed: every call was checked by FlashInfer and ran fused (no
    FlashInfer error, no unfused fallback); the bug: a FlashInfer error or
    a fallback; any exception of the case itself is undecided."""
    if "error" in result:
        return None
    return result["failures"] == 0 and result["unfused"] == 0 and result["checked"] > 0


def value_ranges(values: list[int]) -> list[list[int]]:
    """[1, 2, 3, 7, 8] -> [[1, 3], [7, 8]]"""
    out: list[list[int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


# --------------------------------------------------------------------------
# Scenario entry points (called by scripts/tpfix/replay/harness.py run_scenario)
# --------------------------------------------------------------------------
SEED = {
    "capability": 90,
    "tp": 8,
    "widths": [6144],
    "dtype": "bfloat16",
    "limit": 8192,
    "budget_mb": 0.5,
}


def seed_replay() -> dict[str, Any]:
    """Seed 001: SM90, TP8, hidden 6144 (GLM-5.2), bf16, 0.5 MiB budget."""
    st = setup_recording()
    fi_mnnvl, torch = st["fi_mnnvl"], st["torch"]
    workspace_cls = fi_mnnvl.MNNVLAllReduceFusionWorkspace
    strategy = fi_mnnvl.MNNVLAllreduceFusionStrategy
    tp, hidden, dtype = SEED["tp"], SEED["widths"][0], torch.bfloat16

    # The arithmetic of the report, with FlashInfer's own functions.
    _configure("mnnvl", SEED["capability"])
    per_width_max, _ = _plan(tp, SEED["widths"], dtype, SEED["limit"], SEED["budget_mb"])
    max_tokens = per_width_max[hidden]
    oneshot_tokens = min(
        fi_mnnvl.MNNVL_ONE_SHOT_THRESHOLD // (tp * dtype.itemsize * hidden), max_tokens
    )
    arithmetic = {
        "max_token_num": max_tokens,
        "flashinfer_oneshot_tokens": oneshot_tokens,
        "oneshot_at_threshold": workspace_cls.get_required_buffer_size_bytes(
            tp, oneshot_tokens, hidden, dtype, strategy.ONESHOT
        ),
        "twoshot_at_max": workspace_cls.get_required_buffer_size_bytes(
            tp, max_tokens, hidden, dtype, strategy.TWOSHOT
        ),
        "oneshot_at_40": workspace_cls.get_required_buffer_size_bytes(
            tp, 40, hidden, dtype, strategy.ONESHOT
        ),
        "MNNVL_ONE_SHOT_THRESHOLD": fi_mnnvl.MNNVL_ONE_SHOT_THRESHOLD,
    }
    arithmetic["buffer"] = max(arithmetic["oneshot_at_threshold"], arithmetic["twoshot_at_max"])
    # vLLM v0.27.1's per-rank rule, N * H * elem <= 0.5 MiB (N <= 42), against
    # FlashInfer's MNNVL rule, N * H * TP * elem <= 1 MiB (N <= 10).
    arithmetic["flashinfer_auto_oneshot_tokens"] = [
        n
        for n in range(1, max_tokens + 1)
        if strategy.select_strategy(tp, n, hidden, dtype) == strategy.ONESHOT
    ][-1]

    ns = list(range(1, max_tokens + 1))
    runs = {
        # the tree's one-shot policy applied on MNNVL (forced on trees that
        # abstain there, as vLLM did before vllm#47589)
        "mnnvl_vllm_policy": run_case(
            "mnnvl", token_counts=ns, vllm_table_on_mnnvl=True, max_failures=64, **SEED
        ),
        # what the tree passes to FlashInfer as shipped
        "mnnvl_as_shipped": run_case("mnnvl", token_counts=ns, **SEED),
        "trtllm_as_shipped": run_case("trtllm", token_counts=ns, **SEED),
    }
    failing = runs["mnnvl_vllm_policy"]["failure_examples"]
    return {
        "arithmetic": arithmetic,
        "runs": runs,
        "policy_failing_tokens": [f["num_tokens"] for f in failing],
        "policy_error_at_40": next(
            (f.get("error") for f in failing if f["num_tokens"] == 40), None
        ),
    }


def property_cases(cases: list[dict[str, Any]], granularity: int = 1) -> dict[str, Any]:
    """Run many generated cases in this one interpreter, at the simulated
    MNNVL allocation ``granularity``.

    For each case two questions, over every N up to the token limit (sampled
    above 512 tokens):
    * ``policy``: does the strategy chosen by the tree's one-shot policy fit
      the allocated workspace?  On trees that abstain on MNNVL (v0.27.1 after
      vllm#47589) the policy is the tree's own table, applied as on TRT-LLM.
    * ``as_shipped``: does what the tree passes to FlashInfer fit?
    """
    results = []
    for case in cases:
        res: dict[str, Any] = {"case": case}
        for mode in ("policy", "as_shipped"):
            r = run_case(
                token_counts=_sample_tokens(case),
                max_failures=1,
                vllm_table_on_mnnvl=(mode == "policy"),
                granularity=granularity,
                **case,
            )
            res[mode] = {
                k: r.get(k)
                for k in (
                    "failures",
                    "checked",
                    "unfused",
                    "failure_examples",
                    "vllm_table_forced_on_mnnvl",
                    "fusion",
                )
            }
        results.append(res)
    return {
        "granularity": granularity,
        "n_cases": len(results),
        "policy_failing_cases": sum(bool(r["policy"]["failures"]) for r in results),
        "as_shipped_failing_cases": sum(bool(r["as_shipped"]["failures"]) for r in results),
        "checked": sum(r["policy"]["checked"] or 0 for r in results),
        "unfused": sum(r["policy"]["unfused"] or 0 for r in results),
        "as_shipped_unfused": sum(r["as_shipped"]["unfused"] or 0 for r in results),
        "failing_examples": [r for r in results if r["policy"]["failures"]][:5],
        "as_shipped_failing": [r["case"] for r in results if r["as_shipped"]["failures"]],
    }


def _sample_tokens(case: dict[str, Any]) -> list[int]:
    limit = case["limit"]
    ns = set(range(1, min(limit, 512) + 1))
    ns.update(range(512, limit + 1, max(1, limit // 256)))
    ns.add(limit)
    return sorted(ns)  # run_case drops the N above each width's token limit
