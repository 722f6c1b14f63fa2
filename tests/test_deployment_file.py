# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""`./build.sh doctor --from FILE`: the serve line and its environment read
from Kubernetes manifests and compose files (tpfix.preflight.deployment_file), in the
shapes vLLM's Kubernetes guide and the production-stack Helm chart render
(tests/fixtures/deployments/).  Fast: the reader; slow: the doctor on a
manifest, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpfix.core.util import Fail
from tpfix.preflight import doctor
from tpfix.preflight.deployment_file import Container, serve_line, serve_of

FILES = Path(__file__).resolve().parent / "fixtures" / "deployments"
TARGET = "tests/fixtures/models/Qwen3-30B-A3B"
DRAFT = json.dumps(
    {
        "method": "draft_model",
        "model": "tests/fixtures/models/Qwen3-4B",
        "num_speculative_tokens": 4,
    }
)


def test_vllm_docs_shape_sh_c_script():
    name, args, env = serve_line(FILES / "k8s-vllm-docs.yaml", None)
    assert name == "qwen3-30b"
    assert args == [TARGET, "--tensor-parallel-size", "2", "--speculative-config", DRAFT]
    assert env == {}  # the token comes from a secret (valueFrom): not read


def test_production_stack_shape_command_and_env():
    name, args, env = serve_line(FILES / "production-stack.yaml", None)
    assert name == "vllm"  # the exporter beside it runs no vLLM
    assert args[:2] == [TARGET, "--host"] and args[-2:] == ["--speculative-config", DRAFT]
    assert env == {"VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm"}


def test_official_image_args_are_serve_arguments():
    name, args, env = serve_line(FILES / "statefulset-official-image.yaml", None)
    assert (name, args) == ("server", [TARGET, "--tensor-parallel-size", "2", "--enforce-eager"])
    assert env == {"VLLM_ALLREDUCE_USE_FLASHINFER": "0"}


def test_compose_picks_the_container():
    with pytest.raises(Fail, match=r"several vLLM containers \(chat, embed\); pick one"):
        serve_line(FILES / "compose.yaml", None)
    name, args, env = serve_line(FILES / "compose.yaml", "chat")
    assert args == [TARGET, "--tensor-parallel-size", "2", "--speculative-config", DRAFT]
    assert env == {"VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm"}
    name, args, env = serve_line(FILES / "compose.yaml", "embed")  # the API server module
    assert args == ["--model", "tests/fixtures/models/Qwen3-8B", "-tp", "2", "-O0"]
    assert env == {"TORCH_COMPILE_DISABLE": "1"}


@pytest.mark.parametrize(
    "text, container, message",
    [
        (None, None, "no container runs vllm serve (containers: web)"),
        ("services: {proxy: {image: nginx}}\n", "proxy", "no container 'proxy' runs vllm serve"),
        ("kind: Pod\nspec: [unclosed\n", None, "not valid YAML at line 3"),
        ("apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\n", None, "containers: none"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, text, container, message):
    path = FILES / "no-vllm.yaml"
    if text is not None:
        path = tmp_path / "deploy.yaml"
        path.write_text(text)
    with pytest.raises(Fail, match=message.replace("(", r"\(").replace(")", r"\)")):
        serve_line(path, container)


def test_missing_file(tmp_path):
    with pytest.raises(Fail, match="cannot read it"):
        serve_line(tmp_path / "nope.yaml", None)


def test_doctor_options_with_from(capsys):
    for argv, message in (
        (["--from", str(FILES / "compose.yaml"), "--", "vllm", "serve", "x"], "not both"),
        (["--container", "chat", "--", "vllm", "serve", "x"], "--container goes with --from"),
        (["--from", str(FILES / "no-vllm.yaml")], "no container runs vllm serve"),
    ):
        assert doctor.main(["--json", *argv]) == doctor.EXIT_BAD
        out, err = capsys.readouterr()
        assert message in json.loads(out)["error"] and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_doctor_from_the_production_stack_manifest(capsys):
    """Seed 000's deployment as the Helm chart renders it: stock crashes, the
    wheel fixes it, the backend comes from the container's env."""
    code = doctor.main(["--json", "--from", str(FILES / "production-stack.yaml")])
    report = json.loads(capsys.readouterr()[0])
    assert code == doctor.EXIT_FIXED, report
    assert (report["facts"]["target_hidden"], report["facts"]["draft_hidden"]) == (2048, 2560)
    assert report["allreduce_backend"] == "trtllm"


@pytest.mark.slow
def test_doctor_from_compose_with_compilation_off(capsys):
    code = doctor.main(["--json", "--from", str(FILES / "compose.yaml"), "--container", "embed"])
    report = json.loads(capsys.readouterr()[0])
    assert code == doctor.EXIT_OK, report
    assert "vLLM compiles nothing" in report["facts"]["no_fusion"], report["facts"]


@pytest.mark.parametrize(
    "image, official",
    [
        ("vllm/vllm-openai:v0.27.1", True),
        ("docker.io/vllm/vllm-openai@sha256:" + "0" * 64, True),
        ("registry.local:5000/vllm/vllm-openai", True),  # a port, not a tag
        ("registry.local:5000/vllm/vllm-openai:v0.27.1-tpfix.8", True),
        ("vllm-openai:v0.27.1-tpfix.8", True),
        ("lmcache/vllm-openai-extra:latest", False),
        ("python:3.12", False),
    ],
)
def test_official_image_names(image, official):
    """With no command of its own, the official image's container runs
    `vllm serve` with its args (its entrypoint)."""
    c = Container(name="c", image=image, command=["m", "-tp", "2"])
    assert (serve_of(c) is not None) is official
