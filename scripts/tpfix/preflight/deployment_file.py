# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The `vllm serve` line and its environment, read from a deployment file.

    ./build.sh doctor --from deploy.yaml [--container NAME]

Reads, with PyYAML (every document of the file):

* Kubernetes manifests: a Pod, or a workload with a pod template
  (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob), a
  LeaderWorkerSet (its leader template, else its worker template) and a
  `kind: List` of those; each container's `command` (the image's ENTRYPOINT
  replaced) and `args` (its CMD replaced), and its `env` (`value` entries;
  `valueFrom` ones are secrets or references, not read);
* docker-compose files: each service's `entrypoint`, `command` (a string is
  split as a shell would) and `environment` (a mapping or `KEY=value` list).

A container runs vLLM when its words, as the container starts them, hold
`vllm serve ...`, `python -m vllm.entrypoints.openai.api_server ...`, or a
`sh -c` script with either; the official image (`vllm/vllm-openai`, whose
entrypoint is `vllm serve`) with no command of its own takes `args` alone as
serve arguments.  Everything else is left out.  With several vLLM containers,
`--container NAME` (the container's or the compose service's name) picks one.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpfix.core.util import Fail

API_SERVER = "vllm.entrypoints.openai.api_server"
SHELLS = ("sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash")
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")  # VAR=value before a command
OFFICIAL_IMAGES = ("vllm/vllm-openai", "vllm-openai")


@dataclass
class Container:
    name: str
    image: str = ""
    entrypoint: list[str] | None = None  # the image's ENTRYPOINT replaced
    command: list[str] | None = None  # its CMD replaced
    env: dict[str, str] = field(default_factory=dict)


def _words(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [str(v) for v in value]
    raise Fail(f"{what}: expected a list or a string, got {type(value).__name__}")


def _pod_spec(doc: dict) -> dict | None:
    """The pod spec of a Kubernetes object, or None."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get(
            "spec"
        )
    if kind == "LeaderWorkerSet":
        lws = spec.get("leaderWorkerTemplate") or {}
        template = lws.get("leaderTemplate") or lws.get("workerTemplate") or {}
        return template.get("spec")
    return (spec.get("template") or {}).get("spec")


def _k8s_env(entries: Any) -> dict[str, str]:
    return {
        e["name"]: str(e["value"])
        for e in entries or []
        if isinstance(e, dict) and "name" in e and "value" in e
    }


def _compose_env(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    env = {}
    for item in value or []:
        k, _, v = str(item).partition("=")
        env[k] = v
    return env


def containers(path: Path) -> list[Container]:
    """Every container (or compose service) of the file."""
    import yaml

    try:
        text = path.read_text()
    except OSError as e:
        raise Fail(f"--from {path}: cannot read it ({e.strerror})") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        raise Fail(f"--from {path}: not valid YAML{at}") from None
    found: list[Container] = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "List":
            docs.extend(i for i in doc.get("items") or [] if isinstance(i, dict))
            continue
        if isinstance(doc.get("services"), dict):  # docker-compose
            for name, svc in doc["services"].items():
                svc = svc or {}
                found.append(
                    Container(
                        name=str(name),
                        image=str(svc.get("image", "")),
                        entrypoint=_words(svc.get("entrypoint"), f"{path}: {name}: entrypoint"),
                        command=_words(svc.get("command"), f"{path}: {name}: command"),
                        env=_compose_env(svc.get("environment")),
                    )
                )
            continue
        pod = _pod_spec(doc)
        for c in (pod or {}).get("containers") or []:
            name = str(c.get("name", "?"))
            found.append(
                Container(
                    name=name,
                    image=str(c.get("image", "")),
                    entrypoint=_words(c.get("command"), f"{path}: {name}: command"),
                    command=_words(c.get("args"), f"{path}: {name}: args"),
                    env=_k8s_env(c.get("env")),
                )
            )
    return found


def _official(image: str) -> bool:
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:  # a tag, not a registry's port
        repo = repo.rsplit(":", 1)[0]
    return any(repo == o or repo.endswith("/" + o) for o in OFFICIAL_IMAGES)


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """The VAR=value words a shell sets before a command, and the rest."""
    env, i = {}, 0
    while i < len(words) and ENV_WORD.match(words[i]):
        k, _, v = words[i].partition("=")
        env[k] = v
        i += 1
    return env, words[i:]


def _serve_in(words: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """(serve arguments, VAR=value set before it) where `words` start vLLM's
    server, else None."""
    env, words = split_env(words)
    if words[:1] == ["exec"]:
        words = words[1:]
    if len(words) >= 2 and Path(words[0]).name == "vllm" and words[1] == "serve":
        return words[2:], env
    for j in range(len(words) - 2):
        if Path(words[j]).name.startswith("python") and words[j + 1 : j + 3] == [
            "-m",
            API_SERVER,
        ]:
            return words[j + 3 :], env
    return None


def _script_serve(script: str) -> tuple[list[str], dict[str, str]] | None:
    """The serve command of a `sh -c` script: its first command that starts vLLM."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    command: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= set(";&|"):  # &&, ||, ;, |, &
            if command and (found := _serve_in(command)):
                return found
            command = []
        else:
            command.append(token)
    return None


def serve_of(c: Container) -> tuple[list[str], dict[str, str]] | None:
    """(serve arguments, environment) of a container that runs vLLM's server."""
    if c.entrypoint is None and _official(c.image):  # ENTRYPOINT ["vllm", "serve"]
        words = ["vllm", "serve", *(c.command or [])]
    else:
        words = [*(c.entrypoint or []), *(c.command or [])]
    found = None
    if len(words) >= 3 and words[0] in SHELLS and words[1] == "-c":
        found = _script_serve(words[2])
    elif words:
        found = _serve_in(words)
    if found is None:
        return None
    args, env = found
    return args, {**c.env, **env}


def serve_line(path: Path, container: str | None) -> tuple[str, list[str], dict[str, str]]:
    """(the container's name, its serve arguments, its environment)."""
    every = containers(path)
    vllm = [(c, s) for c in every if (s := serve_of(c)) is not None]
    if container is not None:
        vllm = [(c, s) for c, s in vllm if c.name == container]
    if not vllm:
        which = "container" if container is None else f"container {container!r}"
        names = ", ".join(c.name for c in every) or "none"
        raise Fail(f"--from {path}: no {which} runs vllm serve (containers: {names})")
    if len(vllm) > 1:
        names = ", ".join(c.name for c, _ in vllm)
        raise Fail(f"--from {path}: several vLLM containers ({names}); pick one with --container")
    c, (args, env) = vllm[0]
    return c.name, args, env
