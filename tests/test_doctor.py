# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The preflight command (tpfix.preflight.doctor): a `vllm serve` line as the operator
writes it, parsed by the line's own vLLM, its cold and warm start replayed on
the pristine and on the patched tree (scripts/tpfix/replay/doctor_scenario.py).

The serve lines use model configurations shipped under tests/fixtures/models
(the public config.json fields vLLM reads; nothing is downloaded).  Each
deployment's verdict against the replay's own scenarios:
test_doctor_deployments.py.

Fast tier: bad doctor options (no subprocess), bug C's reading of FlashInfer
against the real import on this host's Python, build.sh's `doctor` case.
Slow: everything that parses a serve line or replays a start.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from doctor_cli import run_doctor, serve, spec
from replays import bug_c_patch

from tpfix.core.lines import get_line
from tpfix.preflight import doctor, doctor_text
from tpfix.replay import bug_a
from tpfix.replay.harness import run_scenario

ROOT = Path(__file__).resolve().parents[1]
HOST = f"{sys.version_info[0]}.{sys.version_info[1]}"
SEED_001_MESSAGE = "Buffer: 1179648 bytes, Required: 3932160 bytes"


# -- fast -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "sm80", *serve("Qwen3-8B")], "unknown --gpu 'sm80'; one of sm90, sm100, sm103"),
        (["--python", "3.9", *serve("Qwen3-8B")], "unknown --python '3.9'"),
        (["--allreduce-backend", "nccl", *serve("Qwen3-8B")], "invalid choice: 'nccl'"),
        (["--", "python", "serve.py"], "give the serve line after --"),
        (["--line", "v9.9.9", *serve("Qwen3-8B")], "invalid choice: 'v9.9.9'"),
    ],
)
def test_bad_doctor_options_exit_3(argv, message, capsys):
    code, report, err = run_doctor(argv, capsys)
    assert code == doctor.EXIT_BAD == 3
    assert message in report["error"] and err.startswith("error: "), (report, err)
    assert "Traceback" not in err


def test_build_sh_doctor_runs_the_doctor():
    proc = subprocess.run(
        [str(ROOT / "build.sh"), "doctor", "--gpu", "sm1", "--", "vllm", "serve", "m"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr
    assert "error: doctor: unknown --gpu 'sm1'" in proc.stderr


def test_bug_c_reading_agrees_with_the_real_import():
    """doctor.bug_c reads FlashInfer's source; on this host's Python it must
    say what the real import (bug_c scenario) does, on the pristine tree
    (FlashInfer 0.6.16.post3) and on the patched one."""
    trees = doctor._trees(get_line(None))
    for name in ("stock", "patched"):
        res = run_scenario(trees[name], "bug_c:import_flashinfer_all_reduce")
        reading = doctor.bug_c(trees[name], HOST)
        if "error" in res:
            assert reading and reading.startswith(doctor.BUG_C_MESSAGE), (name, reading)
            assert f"{res['error']}: {res['message']}" == doctor.BUG_C_MESSAGE, res
        else:
            assert reading is None and res["fi_ar_available"] is True, (name, res)
    # whatever the host: 3.11 hits it on the stock tree of a line whose series
    # re-pins FlashInfer for it (none where the tag's pin is fixed), 3.12 nowhere
    stock_311 = doctor.bug_c(trees["stock"], "3.11")
    if bug_c_patch(get_line(None)):
        assert stock_311.startswith(doctor.BUG_C_MESSAGE)
    else:
        assert stock_311 is None
    assert doctor.bug_c(trees["patched"], "3.11") is None
    assert doctor.bug_c(trees["stock"], "3.12") is None


def test_each_cause_is_said_once():
    """The starts that end in the same error share its line (each start named
    with where it failed); another error gets a line of its own."""
    msg = "ValueError: Workspace validation failed: - token_num (8192) * hidden_dim (2560)"
    shown = doctor_text.start_errors({"cold": msg, "warm": f"{msg} (at profile:draft:8192)"})
    assert shown == [f"cold start, warm start (at profile:draft:8192): {msg}"]
    assert doctor_text.start_errors({"cold": "A: b", "warm": "C: d"}) == [
        "cold start: A: b",
        "warm start: C: d",
    ]
    assert doctor_text.start_errors(None) == []


# -- slow: seeds ----------------------------------------------------------------

SEED_000_LINE = serve(
    "Qwen3-30B-A3B", "--tensor-parallel-size", "2", *spec("Qwen3-4B"),
    "--max-num-batched-tokens", "8192",
)  # fmt: skip


@pytest.mark.slow
def test_seed_000(capsys):
    code, report, err = run_doctor(["--gpu", "sm90", *SEED_000_LINE], capsys)
    assert code == doctor.EXIT_FIXED, report
    f = report["facts"]
    assert (f["target_hidden"], f["draft_hidden"], f["tp"]) == (2048, 2560, 2)
    assert (f["max_num_batched_tokens"], f["dtype"], f["spec_method"]) == (
        8192,
        "bfloat16",
        "draft_model",
    )
    stock, patched = report["verdict"]["stock"], report["verdict"]["patched"]
    for start in ("cold", "warm"):
        assert bug_a.SEED_MESSAGE in stock["models"]["draft"]["result"][start], stock
    assert stock["models"]["target"]["result"] is None
    assert all(m["result"] is None for m in patched["models"].values()), patched
    assert not any(patched["starts"].values())
    assert stock["workspace_mib_per_rank"] == {"buffer_mib": 64, "lamport_mib": 192}
    assert patched["workspace_mib_per_rank"] == {"buffer_mib": 80, "lamport_mib": 240}
    assert patched["models"]["draft"]["fused_tokens"] == "1-8192"
    assert "simulated" in report["simulated"] and "doctor: [" in err  # progress lines


@pytest.mark.slow
def test_seed_000_text_and_python_3_11(capsys):
    code = doctor.main(["--python", "3.11", *SEED_000_LINE])
    text, _ = capsys.readouterr()
    assert code == doctor.EXIT_FIXED
    assert max(map(len, text.splitlines())) <= doctor_text.WIDTH, text
    assert "simulated GPU" in text and "BadInput" not in text and " at 0x" not in text
    out = " ".join(text.split())  # the message as one line, wherever it wrapped
    assert "FlashInfer import (stock): " + doctor.BUG_C_MESSAGE in out
    assert "FlashInfer import (patched): ok" in out
    assert " ".join(bug_a.SEED_MESSAGE.split()) in out
    assert "advice: stock vLLM v0.27.1 crashes" in out
    assert "buffer 64 MiB -> 80 MiB, Lamport 192 MiB -> 240 MiB" in out


@pytest.mark.slow
def test_seed_001(capsys):
    """Seed 001's message came from a nightly that forced vLLM's one-shot table
    on MNNVL; v0.27.1 leaves MNNVL to FlashInfer (vllm#47589), so the doctor
    finds the deployment unaffected, with the seed's arithmetic (fused N <= 42,
    FlashInfer one-shot N <= 10, buffer 1179648 bytes), and the same tree with
    vLLM's table forced (bug_b:seed_replay) gives the seed's exact message."""
    argv = ["--allreduce-backend", "mnnvl", *serve("seed001-hidden6144", "-tp", "8")]
    code, report, _ = run_doctor(argv, capsys)
    assert code == doctor.EXIT_OK, report
    stock = report["verdict"]["stock"]
    assert stock["models"]["target"]["fused_tokens"] == "1-42"
    assert stock["models"]["target"]["oneshot_max_tokens"] == 10
    assert stock["workspace"]["buffer_bytes"] == 1179648
    forced = run_scenario(Path(report["trees"]["stock_replay"]), "bug_b:seed_replay")
    assert SEED_001_MESSAGE in forced["policy_error_at_40"], forced.get("policy_error_at_40")


# -- slow: bad serve lines ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--", "vllm", "serve", "/nonexistent/model", "-tp", "2"],
         "model /nonexistent/model: /nonexistent/model/config.json does not exist"),
        (["--", "vllm", "serve", "no-such-org/no-such-model"],
         "no config.json in the local Hugging Face cache"),
        (serve("Qwen3-8B", "-tp", "2", "--speculative-config", "{model: x"),
         "argument --speculative-config/-sc"),
        (serve("Llama-3.1-8B-Instruct", "--tensor-parallel-size", "3"),
         "must be divisible by tensor parallel size (3)"),
        (serve("Qwen3-8B", "--no-such-flag"), "unrecognized arguments: --no-such-flag"),
        (["--", "vllm", "serve", "-tp", "2"], "no model given"),
    ],
)  # fmt: skip
def test_bad_serve_line_exit_3(argv, message, capsys):
    code, report, err = run_doctor(argv, capsys)
    assert code == 3, report
    assert message in report["error"], report["error"]
    assert err.splitlines()[-1].startswith("error: vllm serve: "), err
    assert "Traceback" not in err and "input_value" not in err
    assert "BadInput" not in err and err.count("vllm serve:") == 1, err


@pytest.mark.slow
def test_pipeline_stages_on_ray_each_form_a_tp_group(capsys):
    """-pp 2 on Ray: vLLM's resolved layout is reported, each stage's TP group
    of 2 is the seed's (Ray itself runs on the deployment's hosts: its
    import is stood in, see doctor_scenario._stand_in_for_ray)."""
    line = serve(
        "Qwen3-30B-A3B", "-tp", "2", "-pp", "2", "--distributed-executor-backend", "ray",
        *spec("Qwen3-4B"),
    )  # fmt: skip
    code, report, _ = run_doctor(["--gpu", "sm90", *line], capsys)
    f = report["facts"]
    assert (f["tp"], f["pp"], f["dp"], f["executor"]) == (2, 2, 1, "ray"), f
    assert code == doctor.EXIT_FIXED, report
    draft = report["verdict"]["stock"]["models"]["draft"]["result"]
    assert bug_a.SEED_MESSAGE in draft["cold"] and bug_a.SEED_MESSAGE in draft["warm"]
    text = " ".join(doctor_text.text(report).split())
    assert "layout: 2 pipeline stage(s) x 1 data-parallel replica(s), executor ray" in text


@pytest.mark.slow
def test_seed_000_on_v0_34_0(capsys):
    """v0.34.0 sizes the pass for max(target, draft) (vllm#52193): the cold
    start works; the warm start (no pass, the target's op creates it) still
    dies of the seed's message; the line's patched tree starts both."""
    code, report, _ = run_doctor(["--line", "v0.34.0", *SEED_000_LINE], capsys)
    assert code == doctor.EXIT_FIXED, report
    stock, patched = report["verdict"]["stock"], report["verdict"]["patched"]
    assert stock["starts"]["cold"] is None
    assert bug_a.SEED_MESSAGE in stock["starts"]["warm"], stock["starts"]
    assert stock["models"]["draft"]["result"] == {"warm": stock["starts"]["warm"]}
    assert not any(patched["starts"].values()), patched["starts"]


# -- slow: where the resolved configuration fuses nothing -------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "opts, reason",
    [
        # vLLM turns compilation off; pass_config.fuse_allreduce_rms stays True
        (["--enforce-eager"], "--enforce-eager: vLLM compiles nothing"),
        (["-O0"], "-O0: vLLM compiles nothing"),
        (["-cc.pass_config.fuse_allreduce_rms=false"], "fuse_allreduce_rms is off on the serve"),
    ],
    ids=["enforce-eager", "O0", "fusion-off"],
)
def test_no_fused_all_reduce_is_unaffected_without_a_replay(opts, reason, capsys):
    """The seed-000 deployment, which crashes stock vLLM with fusion on, is
    unaffected where vLLM's resolved configuration runs no fusion pass; the
    doctor says why and claims no replay."""
    code, report, _ = run_doctor(["--gpu", "sm90", *SEED_000_LINE, *opts], capsys)
    assert code == doctor.EXIT_OK, report
    assert reason in report["facts"]["no_fusion"], report["facts"]
    assert report["verdict"] == {}
    assert report["advice"] == "unaffected: no fused all-reduce, so bugs A and B cannot occur."
    assert "replay" not in report["advice"]
    out = doctor_text.text(report)  # what the text output prints of the same report
    assert "simulated" not in out and reason in out


@pytest.mark.slow
@pytest.mark.parametrize("value, fused", [("1", False), ("true", True)])
def test_torch_compile_disable_as_vllm_reads_it(value, fused, capsys):
    """TORCH_COMPILE_DISABLE turns compilation off only as "1" (vLLM's test
    and torch's): "true" compiles, so seed 000 still crashes stock vLLM."""
    line = ["--", f"TORCH_COMPILE_DISABLE={value}", *SEED_000_LINE[1:]]
    code, report, _ = run_doctor(line, capsys)
    if fused:
        assert code == doctor.EXIT_FIXED, report
        assert report["facts"]["no_fusion"] is None
    else:
        assert code == doctor.EXIT_OK, report
        assert report["facts"]["no_fusion"].startswith("TORCH_COMPILE_DISABLE=1: vLLM compiles")
        assert report["verdict"] == {}


@pytest.mark.slow
def test_the_fusion_budget_on_the_serve_line_is_replayed(capsys):
    """pass_config.fi_allreduce_fusion_max_size_mb=1 (1 MiB): vLLM's own
    compile ranges bound the target (2048 wide, bf16) at 256 tokens and the
    drafter (2560) at 204; stock's workspace is 256 x 2048, which the
    drafter's 204 tokens fit: seed 000 with this budget starts."""
    budget = ["-cc.pass_config.fi_allreduce_fusion_max_size_mb=1"]
    code, report, _ = run_doctor([*SEED_000_LINE, *budget], capsys)
    assert report["facts"]["fusion_max_size_mb"] == 1
    assert code == doctor.EXIT_OK, report
    stock = report["verdict"]["stock"]
    assert stock["models"]["target"]["fused_up_to"] == 256
    assert stock["models"]["draft"]["fused_up_to"] == 204
    assert (stock["workspace"]["max_token_num"], stock["workspace"]["hidden_dim"]) == (256, 2048)


@pytest.mark.slow
def test_the_cuda_graph_mode_on_the_serve_line_is_replayed(capsys):
    """-cc.cudagraph_mode=NONE: vLLM captures no CUDA graph, so the warm
    start replayed is the profile run alone; vLLM's default mode captures
    its capture sizes after it."""
    counts = {}
    for mode in ([], ["-cc.cudagraph_mode=NONE"]):
        code, report, _ = run_doctor([*SEED_000_LINE, *mode], capsys)
        assert code == doctor.EXIT_FIXED, report
        patched = report["verdict"]["patched"]
        counts[report["facts"]["cudagraph_mode"]] = patched["capture_sizes"]
    assert counts.pop("NONE") == 0
    ((default, captured),) = counts.items()
    assert default != "NONE" and captured > 0, (default, captured)


@pytest.mark.slow
def test_lost_fusion_is_a_finding(capsys):
    """v0.34.0 bounds every model's fused tokens by the widest model (vllm#52193):
    SM90 TP4 (2 MiB), target 2048 / draft 2560, the target fuses up to 409
    tokens on stock and up to its own 512 with the patched wheel."""
    argv = ["--line", "v0.34.0", *serve("Qwen3-30B-A3B", "-tp", "4", *spec("Qwen3-4B"))]
    code, report, _ = run_doctor(argv, capsys)
    assert code == doctor.EXIT_FIXED  # the draft's warm start crashes stock: unchanged
    assert report["lost_fusion"] == [
        {"model": "target", "stock": "1-409", "patched": "1-409, 410-512"}
    ]
    out = doctor_text.text(report)  # what the text output prints of the same report
    assert "  lost fusion: stock fuses tokens 1-409 of the target, the patched wheel" in out


@pytest.mark.slow
def test_what_is_not_modelled_is_said_not_replayed(capsys):
    """An FP8 deployment with the standalone FlashInfer all-reduce on: what is
    not modelled (the quantized fused patterns, the standalone all-reduce) is
    said in one line each instead of being ignored."""
    line = ["--", "VLLM_ALLREDUCE_USE_FLASHINFER=1", *SEED_000_LINE[1:], "--quantization", "fp8"]
    code, report, _ = run_doctor(line, capsys)
    assert report["facts"]["quantization"] == "fp8", report["facts"]
    assert report["facts"]["standalone_allreduce"] is True, report["facts"]
    assert report["quantized"].startswith("quantization fp8: not replayed: "), report
    assert report["standalone"].startswith("VLLM_ALLREDUCE_USE_FLASHINFER=1: not replayed: ")
    assert code in (doctor.EXIT_FIXED, doctor.EXIT_OK)
    out = doctor_text.text(report).splitlines()
    assert sum("not replayed" in ln for ln in out) == 2, out


def test_vllm_errors_are_said_without_pydantic_framing():
    message = (
        "1 validation error for VllmConfig\n  Value error, torch.float32 is not supported for "
        "quantization method fp8. [type=value_error, input_value=ArgsKwargs((), {}), "
        "input_type=ArgsKwargs]\n    For further information visit "
        "https://errors.pydantic.dev/2.12/v/value_error"
    )
    assert doctor._vllm_message(message) == (
        "float32 is not supported for quantization method fp8."
    )


def _readme_doctor_example() -> tuple[str, str]:
    """The README's doctor command (its ```sh block) and the output shown below it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Will my deployment crash?") :]
    block = section[section.index("```sh\n") + len("```sh\n") :]
    command, _, rest = block.partition("```\n```\n")
    return command.strip(), rest[: rest.index("```")]


@pytest.mark.slow
def test_readme_doctor_command_from_a_fresh_clone(tmp_path: Path):
    """The README's doctor command, as written, in a fresh clone of this
    repository's HEAD (no build/venv: the command sets it up, installs what
    the replays import and fetches what it needs; downloads come from the
    shared cache as they would on a second machine of a user): the exit code
    of a crash the wheel fixes, and the output the README shows."""
    command, shown = _readme_doctor_example()
    assert command.startswith("./build.sh doctor -- vllm serve "), command
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    assert not (clone / "build").exists()
    proc = subprocess.run(
        ["bash", "-c", command], cwd=clone, text=True, capture_output=True, timeout=1800
    )
    assert proc.returncode == doctor.EXIT_FIXED, proc.stderr[-4000:]
    assert proc.stdout == shown, proc.stdout
    assert "setting up" in proc.stderr  # it made its own venv
