# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Deployments through the preflight (tpfix.preflight.doctor), each verdict checked
against the replay's own scenarios (bug_a:cold_start and
bug_a:warm_start_capture_order, run separately, with the hidden sizes written
here, not taken from the doctor) on the same trees.  The serve lines use the
model configurations of tests/fixtures/models (nothing is downloaded).
Slow: each parses a serve line and replays its starts."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from doctor_cli import run_doctor, serve, spec

from tpfix.preflight import doctor
from tpfix.replay.harness import Interpreter


def deployment(name, model, serve_opts, target, draft, opts=(), capability=90, backend="trtllm"):
    """One case: the serve line's model and options, the hidden sizes the
    fixtures have (target, draft), the doctor's own options."""
    return pytest.param(
        (model, list(serve_opts), target, draft, list(opts), capability, backend), id=name
    )


MNNVL = ["--allreduce-backend", "mnnvl"]
DEPLOYMENTS = [
    deployment("qwen3-30b-a3b+4b", "Qwen3-30B-A3B", ["-tp", "2", *spec("Qwen3-4B")], 2048, 2560),
    deployment("qwen3-1.7b+4b-tp4", "Qwen3-1.7B", ["-tp", "4", *spec("Qwen3-4B")], 2048, 2560),
    deployment("qwen3-8b+0.6b", "Qwen3-8B", ["-tp", "2", *spec("Qwen3-0.6B")], 4096, 1024),
    deployment(
        "llama-70b+1b-tp8",
        "Llama-3.1-70B-Instruct",
        ["-tp", "8", *spec("Llama-3.2-1B-Instruct")],
        8192,
        2048,
    ),
    deployment(
        "llama-1b+3b-sm100",
        "Llama-3.2-1B-Instruct",
        ["-tp", "2", *spec("Llama-3.2-3B-Instruct")],
        2048,
        3072,
        opts=["--gpu", "sm100"],
        capability=100,
    ),
    deployment(
        "llama-8b+eagle",
        "Llama-3.1-8B-Instruct",
        ["-tp", "2", *spec("EAGLE-LLaMA3.1-Instruct-8B", "eagle")],
        4096,
        4096,
    ),
    deployment(
        "qwen3-32b-tp4-sm103",
        "Qwen3-32B",
        ["-tp", "4"],
        5120,
        None,
        opts=["--gpu", "sm103"],
        capability=103,
    ),
    deployment("llama-70b-tp8", "Llama-3.1-70B-Instruct", ["-tp", "8"], 8192, None),
    deployment(
        "qwen3-30b-a3b+4b-2048",
        "Qwen3-30B-A3B",
        ["-tp", "2", *spec("Qwen3-4B"), "--max-num-batched-tokens", "2048"],
        2048,
        2560,
    ),
    deployment(
        "qwen3-30b-a3b+4b-mnnvl",
        "Qwen3-30B-A3B",
        ["-tp", "2", *spec("Qwen3-4B")],
        2048,
        2560,
        opts=MNNVL,
        backend="mnnvl",
    ),
    deployment(
        "qwen3-8b+1.7b-mnnvl-tp8-sm100",
        "Qwen3-8B",
        ["-tp", "8", *spec("Qwen3-1.7B")],
        4096,
        2048,
        opts=[*MNNVL, "--gpu", "sm100"],
        capability=100,
        backend="mnnvl",
    ),
    deployment(  # two nodes of one NVLink domain (MNNVL), launched by Ray, 2 replicas
        "llama-70b+8b-tp16-mnnvl-ray-dp2-sm100",
        "Llama-3.1-70B-Instruct",
        [
            "-tp",
            "16",
            "-dp",
            "2",
            "--distributed-executor-backend",
            "ray",
            *spec("Llama-3.1-8B-Instruct"),
        ],
        8192,
        4096,
        opts=[*MNNVL, "--gpu", "sm100"],
        capability=100,
        backend="mnnvl",
    ),
    deployment(
        "llama-8b+1b-fp16",
        "Llama-3.1-8B-Instruct",
        ["-tp", "2", "--dtype", "float16", *spec("Llama-3.2-1B-Instruct")],
        4096,
        2048,
    ),
]


@pytest.fixture(scope="module")
def replayers():
    """One interpreter per tree and all-reduce backend that has imported vLLM
    and the replay's modules (prepare, as the doctor's do), kept for all the
    deployments of this module: get(tree, backend) -> Interpreter.  Each
    start runs in a fork of it."""
    with contextlib.ExitStack() as stack:
        made: dict[tuple[Path, str], Interpreter] = {}
        lock = threading.Lock()

        def get(tree: Path, backend: str) -> Interpreter:
            with lock:
                if (tree, backend) not in made:
                    ahead = [("doctor_scenario:prepare", {"backend": backend})]
                    interpreter = Interpreter(tree, ahead, timeout=3600)
                    made[tree, backend] = stack.enter_context(interpreter)
                return made[tree, backend]

        yield get


def _replay(interpreter: Interpreter, kw: dict) -> dict:
    """The replay's own cold and warm start, each in its own fork of an
    interpreter that has only imported vLLM (no state of one start reaches
    the other, nor a deployment the next; the doctor runs both starts in one
    interpreter, device.new_process between)."""
    cold = {k: v for k, v in kw.items() if k != "cudagraph_mode"}  # it captures nothing
    return {
        "cold": interpreter.run("bug_a:cold_start", fork=True, **cold),
        "warm": interpreter.run("bug_a:warm_start_capture_order", fork=True, **kw),
    }


def _errors(runs: dict) -> dict:
    return {k: doctor._error(r) for k, r in runs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", DEPLOYMENTS)
def test_deployment_agrees_with_the_replay(case, capsys, replayers):
    model, serve_opts, target, draft, opts, capability, backend = case
    code, report, _ = run_doctor([*opts, *serve(model, *serve_opts)], capsys)
    f = report["facts"]
    assert (f["target_hidden"], f["draft_hidden"]) == (target, draft), f
    kw = dict(
        target_hidden=target,
        draft_hidden=draft,
        tp=f["tp"],
        capability=capability,
        max_num_batched_tokens=f["max_num_batched_tokens"],
        backend=backend,
    )
    trees = {k: Path(v) for k, v in report["trees"].items()}
    kw["cudagraph_mode"] = f["cudagraph_mode"]  # as vLLM resolved it for the line
    failed = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        replays = {
            which: pool.submit(_replay, replayers(trees[t], backend), kw)
            for which, t in (("stock", "stock_replay"), ("patched", "patched"))
        }
    for which, future in replays.items():
        replay = _errors(future.result())
        starts = report["verdict"][which]["starts"]
        assert {k: starts[k] for k in ("cold", "warm")} == replay, (which, starts, replay)
        sweep = starts.get("bug_b_sweep") or {}
        failed[which] = any(replay.values()) or bool(sweep.get("failures"))
    expect = 2 if failed["patched"] else 1 if failed["stock"] else 0
    assert code == expect == report["exit_code"], (code, failed)
    # a proposer other than a draft model: replayed as one, and said so
    method = f["spec_method"] if draft is not None else "draft_model"
    assert ("spec" in report) == (method != "draft_model"), report.get("spec")
