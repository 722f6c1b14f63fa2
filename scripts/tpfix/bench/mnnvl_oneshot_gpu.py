#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Tune the one-shot/two-shot crossover of FlashInfer's fused all-reduce.

GPU micro-benchmark for owners of multi-GPU machines (bug B, issue 4).  For one
(device capability, TP size, hidden size, dtype) it times FlashInfer's
``allreduce_fusion`` (all-reduce + residual add + RMSNorm, the pattern vLLM's
fusion pass uses) with the one-shot and the two-shot strategy forced, for a
sweep of token counts, and reports the largest token count for which one-shot
is still faster, converted to the unit vLLM's patched thresholds use:

    all-reduce bytes = num_tokens * hidden_size * element_size * world_size

(what one rank's one-shot buffer must hold).  That number is what to compare
with FlashInfer's ``MNNVL_ONE_SHOT_THRESHOLD`` (1 MiB; FlashInfer's own choice
on MNNVL) or with
``_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB`` x world_size (TRT-LLM) in
vllm/compilation/passes/fusion/allreduce_rms_fusion.py.  The
script also prints the per-rank MNNVL buffer FlashInfer needs to serve one-shot
up to that size (``MNNVLAllReduceFusionWorkspace.get_required_buffer_size_bytes``),
so the memory cost of a larger threshold is visible.

The MNNVL workspace is created with ``force_oneshot_support=True`` so that
one-shot can be timed for every token count of the sweep (this takes more GPU
memory than vLLM uses; it is freed at exit).  MNNVL needs NVLink multicast
(NVSwitch systems: HGX H100/H200/B200, GB200 NVL); TRT-LLM works on any
single-node NVLink/PCIe topology.

Usage (one process per GPU; all on one node unless the backend is mnnvl):
    torchrun --nproc_per_node=8 scripts/tpfix/bench/mnnvl_oneshot_gpu.py \\
        --hidden 6144 --dtype bfloat16 --max-tokens 512
    torchrun --nproc_per_node=4 scripts/tpfix/bench/mnnvl_oneshot_gpu.py \\
        --backend trtllm --hidden 4096 --tokens 1,2,4,8,16,32,64,128,256
    # multi-node MNNVL (GB200 NVL): add --nnodes/--node-rank/--rdzv-endpoint

Options: --backend {mnnvl,trtllm} (default mnnvl), --hidden, --dtype
{bfloat16,float16,float32}, --max-tokens N (sweep powers of two and the
midpoints between them up to N) or --tokens list, --iters (launches per CUDA
graph, default 50), --repeats (default 10), --no-graph (eager timing),
--json FILE (write the measurements).  Rank 0 prints a table and the crossover;
timings are the maximum over ranks of the median over repeats.

Requires: CUDA GPUs, torch with NCCL, flashinfer-python (0.6.16.post4 was used
to write this; ``create_allreduce_fusion_workspace(..., force_oneshot_support=)``
and ``allreduce_fusion(..., use_oneshot=)`` must exist).  vLLM is not needed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics

import torch
import torch.distributed as dist

MiB = 1024 * 1024


def _token_sweep(max_tokens: int) -> list[int]:
    out, n = set(), 1
    while n <= max_tokens:
        out.add(n)
        out.add(n + n // 2)
        n *= 2
    out.add(max_tokens)
    return sorted(t for t in out if t <= max_tokens)


def _time_us(fn, iters: int, repeats: int, use_graph: bool) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if use_graph:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()  # warm up on the capture stream
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(iters):
                    fn()
        torch.cuda.synchronize()
        run = graph.replay
    else:

        def run():
            for _ in range(iters):
                fn()

    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / iters)
    t = torch.tensor([statistics.median(samples)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["mnnvl", "trtllm"], default="mnnvl")
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument(
        "--tokens",
        type=str,
        default=None,
        help="comma-separated token counts (overrides --max-tokens)",
    )
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()

    if "RANK" not in os.environ:
        raise SystemExit(
            f"run with torchrun, e.g. torchrun --nproc_per_node=8 {os.path.basename(__file__)}"
        )

    import flashinfer.comm as fi_comm
    from flashinfer.comm.mnnvl import TorchDistBackend
    from flashinfer.comm.trtllm_mnnvl_ar import (
        MNNVL_ONE_SHOT_THRESHOLD,
        MNNVLAllreduceFusionStrategy,
        MNNVLAllReduceFusionWorkspace,
    )

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    elem = dtype.itemsize
    hidden = args.hidden
    tokens = (
        sorted({int(t) for t in args.tokens.split(",")})
        if args.tokens
        else _token_sweep(args.max_tokens)
    )
    max_tokens = max(tokens)
    cap = torch.cuda.get_device_capability()
    capability = cap[0] * 10 + cap[1]

    group = dist.group.WORLD
    kwargs = {}
    if args.backend == "mnnvl":
        kwargs["force_oneshot_support"] = True
    workspace = fi_comm.create_allreduce_fusion_workspace(
        backend=args.backend,
        world_size=world_size,
        rank=rank,
        # + world_size: two-shot rounds num_tokens up to a multiple of TP
        max_token_num=max_tokens + world_size,
        hidden_dim=hidden,
        dtype=dtype,
        comm_backend=TorchDistBackend(group=group),
        group=group,
        **kwargs,
    )

    pattern = fi_comm.AllReduceFusionPattern.kARResidualRMSNorm
    gamma = torch.randn(hidden, dtype=dtype, device="cuda")
    rows = []
    for n in tokens:
        x = torch.randn(n, hidden, dtype=dtype, device="cuda") / world_size
        residual = torch.randn_like(x)
        residual_out = torch.empty_like(x)
        norm_out = torch.empty_like(x)
        row = {"num_tokens": n, "oneshot_bytes": n * hidden * elem * world_size}
        for name, use_oneshot in (("oneshot", True), ("twoshot", False)):
            if not use_oneshot and args.backend == "trtllm" and n <= world_size:
                row[name] = None  # TRT-LLM two-shot needs num_tokens > TP
                continue

            fn = functools.partial(
                fi_comm.allreduce_fusion,
                input=x,
                workspace=workspace,
                pattern=pattern,
                launch_with_pdl=True,
                trigger_completion_at_end=True,
                residual_out=residual_out,
                norm_out=norm_out,
                residual_in=residual,
                rms_gamma=gamma,
                rms_eps=1e-6,
                use_oneshot=use_oneshot,
                fp32_acc=True,
            )
            row[name] = _time_us(fn, args.iters, args.repeats, not args.no_graph)
        rows.append(row)

    if rank == 0:
        print(
            f"backend={args.backend} SM{capability} TP{world_size} "
            f"hidden={hidden} dtype={args.dtype} "
            f"graph={not args.no_graph}"
        )
        print(f"{'tokens':>7} {'1shot bytes':>12} {'1shot us':>9} {'2shot us':>9}")
        for r in rows:
            one, two = r["oneshot"], r["twoshot"]
            print(
                f"{r['num_tokens']:>7} {r['oneshot_bytes']:>12} "
                f"{one:>9.2f} {'-' if two is None else f'{two:>9.2f}':>9}"
            )
        faster = [r for r in rows if r["twoshot"] is None or r["oneshot"] <= r["twoshot"]]
        crossover = None
        for r in rows:  # last token count of the leading run where one-shot wins
            if r not in faster:
                break
            crossover = r
        if crossover is None:
            print("one-shot is never faster: threshold 0")
        else:
            n = crossover["num_tokens"]
            print(
                f"one-shot faster up to {n} tokens = "
                f"{crossover['oneshot_bytes']} one-shot bytes "
                f"({crossover['oneshot_bytes'] / MiB:.3f} MiB)"
            )
            if args.backend == "mnnvl":
                buf = MNNVLAllReduceFusionWorkspace.get_required_buffer_size_bytes(
                    world_size, n, hidden, dtype, MNNVLAllreduceFusionStrategy.ONESHOT
                )
                print(
                    f"FlashInfer default MNNVL_ONE_SHOT_THRESHOLD = "
                    f"{MNNVL_ONE_SHOT_THRESHOLD} bytes; a one-shot range up to "
                    f"{n} tokens needs an MNNVL buffer of >= {buf} bytes "
                    f"(x{MNNVLAllReduceFusionWorkspace.NUM_LAMPORT_BUFFERS} "
                    "Lamport buffers per rank)"
                )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "backend": args.backend,
                        "capability": capability,
                        "world_size": world_size,
                        "hidden": hidden,
                        "dtype": args.dtype,
                        "rows": rows,
                    },
                    f,
                    indent=1,
                )

    dist.barrier()
    workspace.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
