# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Upstream pins a new line cannot take as they are, and the re-pin that
replaces one (tpfix.maint.start_line --repin NAME==VERSION).

unserved(wheel)      the `==` pins of an official wheel that the package index
                     pip is configured with does not serve, for the official
                     image's Python and platform (`pip index versions`)
repin_patch(...)     the line's first patch, in the shape of v0.27.1's 0001:
                     requirements/*.txt (with the project's same-version
                     companions, e.g. flashinfer-cubin), docker/Dockerfile's
                     `ARG <PROJECT>_VERSION` and docker/versions.json move together
api_problems(...)    the re-pin checked, not assumed (tpfix.replay.deps, also
                     a replay scenario): every FlashInfer name that the tree's
                     vLLM imports exists in the re-pinned release, and each call
                     vLLM makes of such a function passes arguments it accepts
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from tpfix.audit.resolution import marker_env, target_platforms
from tpfix.core.util import Fail
from tpfix.core.wheelfile import wheel_requirements

# --- pins the index does not serve ---------------------------------------


def _served_versions(name: str, python: str, platform: str) -> list[str] | None:
    """The versions of `name` pip's index serves for the target, every
    manylinux tag it installs (None: pip failed)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", name, "--disable-pip-version-check"]
    cmd += ["--python-version", python, "--only-binary", ":all:"]
    for plat in target_platforms(platform):
        cmd += ["--platform", plat]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"^Available versions: (.*)$", proc.stdout, re.M)
    if m:
        return [v.strip() for v in m.group(1).split(",")]
    return [] if "No matching distribution" in proc.stderr + proc.stdout else None


def unserved(wheel: Path, python: str, platform: str) -> list[tuple[str, str, list[str]]]:
    """(name, version, the versions the index has) of each `==` pin of the
    official wheel that the index lacks for CPython `python` on `platform`
    (`x86_64-manylinux_2_35`: resolution.target's form; its markers, no extras)."""
    env = marker_env(python, platform.partition("-")[0])
    pins = []
    for req in wheel_requirements(wheel):
        spec = list(req.specifier)
        applies = req.marker is None or req.marker.evaluate({**env, "extra": ""})
        if len(spec) == 1 and spec[0].operator == "==" and not req.extras and applies:
            pins.append((req.name, spec[0].version))
    # one pip at a time: pips run side by side share the HTTP cache and were
    # seen to read a project's page half written (a version list cut short)
    got = [_served_versions(name, python, platform) for name, _ in pins]
    out = []
    for (name, version), versions in zip(pins, got):
        if versions is None:
            raise Fail(f"pip index versions {name} failed: is the package index reachable?")
        if version not in versions:
            out.append((name, version, versions))
    return out


def nearby(version: str, versions: list[str]) -> list[str]:
    """The final releases just below and above `version` among `versions`."""
    finals = []
    for v in versions:
        try:
            if not Version(v).is_prerelease:
                finals.append(Version(v))
        except InvalidVersion:
            continue
    want = Version(version)
    below = [v for v in finals if v < want]
    above = [v for v in finals if v > want]
    return [str(v) for v in ([max(below)] if below else []) + ([min(above)] if above else [])]


# --- the re-pin patch ----------------------------------------------------


def parse_repin(text: str) -> tuple[str, str]:
    try:
        req = Requirement(text)
    except Exception:
        req = None
    spec = list(req.specifier) if req else []
    if not req or len(spec) != 1 or spec[0].operator != "==" or req.extras or req.marker:
        raise Fail(f"--repin {text!r}: expected NAME==VERSION, e.g. flashinfer-python==0.7.4")
    return canonicalize_name(req.name), spec[0].version


def _family(name: str) -> str:
    """flashinfer-python -> flashinfer: the prefix its same-version companions share."""
    return canonicalize_name(name).removesuffix("-python")


def repin_edits(tree: Path, name: str, old: str, new: str) -> dict[str, tuple[str, str]]:
    """{path: (before, after)} of every file of `tree` that pins `name` (or a
    same-version companion) at `old`: requirements/*.txt, docker/Dockerfile's
    ARG <FAMILY>_VERSION, docker/versions.json's entries under the family."""
    fam = _family(name)
    req_line = re.compile(
        rf"^({re.escape(fam)}(?:-[a-z0-9-]+)?)==({re.escape(old)})(\s|$)", re.M | re.I
    )
    edits = {}
    for path in sorted((tree / "requirements").glob("*.txt")):
        text = path.read_text()
        after = req_line.sub(lambda m: f"{m[1]}=={new}{m[3]}", text)
        if after != text:
            edits[str(path.relative_to(tree))] = (text, after)
    docker = tree / "docker" / "Dockerfile"
    if docker.exists():
        text = docker.read_text()
        arg = re.compile(
            rf"^(ARG {re.escape(fam.upper().replace('-', '_'))}_VERSION=){re.escape(old)}$", re.M
        )
        after = arg.sub(lambda m: m[1] + new, text)
        if after != text:
            edits["docker/Dockerfile"] = (text, after)
    versions = tree / "docker" / "versions.json"
    if versions.exists():
        text, out, inside = versions.read_text(), [], 0
        for line in text.splitlines(keepends=True):
            if re.search(rf'"{re.escape(fam)}[^"]*"\s*:\s*\{{', line, re.I):
                inside = 1
            elif inside:
                inside += line.count("{") - line.count("}")
                line = line.replace(f'"{old}"', f'"{new}"')
            out.append(line)
        if "".join(out) != text:
            edits["docker/versions.json"] = (text, "".join(out))
    if not any(p.startswith("requirements/") for p in edits):
        raise Fail(f"the tree's requirements/*.txt pin no {name}=={old}: nothing to re-pin")
    return edits


def _fill(text: str, **kwargs) -> str:
    """A header paragraph at 76 columns; a long path stays whole."""
    return textwrap.fill(text, 76, break_long_words=False, break_on_hyphens=False, **kwargs)


def repin_patch(tree: Path, tag: str, name: str, old: str, new: str, problems: list[str]) -> str:
    """The line's first patch (header and diff) re-pinning `name` from `old` to `new`."""
    diff = []
    for path, (before, after) in repin_edits(tree, name, old, new).items():
        diff += difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
            n=3,
        )
    if problems:
        checked = (
            f"Checked, not assumed (tpfix.replay.deps.api_problems): what vLLM {tag} "
            f"uses of {_family(name)} was read from the tree and looked up in {name} "
            f"{new}.  It lacks these, which a patch of their own must port before "
            "the line ships:"
        )
        checked = (
            _fill(checked)
            + "\n"
            + "".join(
                _fill(p, initial_indent="- ", subsequent_indent="  ") + "\n" for p in problems
            )
        )
    else:
        checked = (
            _fill(
                f"Checked, not assumed (tpfix.replay.deps.api_problems): every "
                f"{_family(name)} name that vLLM {tag} imports exists in {name} {new}, "
                "and each call vLLM makes of such a function passes arguments its "
                "signature accepts.",
            )
            + "\n"
        )
    why = _fill(
        f"vLLM {tag} pins {name}=={old} (requirements/cuda.txt and the wheel's "
        "Requires-Dist), a release the package index does not serve, so upstream's "
        f"own wheel does not install: pip stops with `No matching distribution found "
        f"for {name}=={old}`.  This re-pins it to {new}, which the index serves, "
        "together with the pins that must carry the same version.",
    )
    # the replays' check of a FlashInfer re-pin (tpfix.replay.deps)
    scenario = (
        "Scenario: deps:pinned_flashinfer\n the FlashInfer the tree pins is the release the"
        " index serves and the\n replays run\n"
        if name == "flashinfer-python"
        else ""
    )
    header = f"""\
From: vLLM tpfix maintainers <maintainers@tpfix.invalid>
Subject: [PATCH] [Deps] Re-pin {name} to {new}: {old} is not on
 the package index

{why}

{checked}
The scenario replays run with {new}.

Related: upstream's pin of {name}=={old},
 https://github.com/vllm-project/vllm/blob/{tag}/requirements/cuda.txt
Forwarded: not-needed
{scenario}Claim: vLLM {tag} with this series requires {name}=={new},
 which the package index serves, so the wheel installs where upstream's
 does not
Signed-off-by: vLLM tpfix maintainers <maintainers@tpfix.invalid>
---
"""
    return header + "".join(diff)
