# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The wheel's dependency set on the line's reference platform, resolved by uv.

One resolution for every later step that needs the set (tpfix.audit.advisories
audits it, tpfix.audit.resolved_sbom describes it): `uv pip compile` of the wheel
for the official image's Python (the pins' `image-python`) and platform
(manylinux for the glibc of the Ubuntu its docker/Dockerfile names), binary
wheels only, markers evaluated for that target, from the index uv is
configured with or `--index-url`.  uv writes the result as a PEP 751 lock
(pylock.toml): each package's exact version and the wheels it resolved,
with their URL and sha256.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from tpfix.core.lines import Line
from tpfix.core.util import Fail
from tpfix.core.wheelfile import wheel_requirements

# glibc of the Ubuntu release the official image's docker/Dockerfile names.
UBUNTU_GLIBC = {"20.04": "2_31", "22.04": "2_35", "24.04": "2_39"}


def target(line: Line, arch: str) -> dict:
    """Python, platform and marker environment of the line's official image."""
    from tpfix.audit.support_matrix import dockerfile_arg, pin_facts
    from tpfix.stages.fetch import fetch_sdist

    python = pin_facts(line).get("image-python")
    ubuntu = dockerfile_arg(fetch_sdist(line.tag), "UBUNTU_VERSION")
    if not python or ubuntu not in UBUNTU_GLIBC:
        raise Fail(
            f"{line.tag}: the official image's Python ({python}) or Ubuntu ({ubuntu}, "
            f"from the sdist's docker/Dockerfile) is not known; known: {sorted(UBUNTU_GLIBC)}"
        )
    env = marker_env(python, arch)
    return {"python": python, "platform": f"{arch}-manylinux_{UBUNTU_GLIBC[ubuntu]}", "env": env}


def marker_env(python: str, arch: str) -> dict:
    """The PEP 508 marker environment of CPython `python` (X.Y) on Linux
    `arch`, with no extra asked for."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "platform_machine": arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def needed(wheel: Path, env: dict) -> set[str]:
    """The wheel's requirements that apply on the target, without extras."""
    return {
        canonicalize_name(r.name)
        for r in wheel_requirements(wheel)
        if r.marker is None or Marker(str(r.marker)).evaluate(env)
    }


def _uv() -> str:
    uv = Path(sys.executable).with_name("uv")
    found = str(uv) if uv.exists() else shutil.which("uv")
    if not found:
        raise Fail("uv is not installed: ./build.sh installs it (ci/requirements-build.txt)")
    return found


def uv_version() -> str:
    return subprocess.run([_uv(), "--version"], capture_output=True, text=True).stdout.strip()


def _tail(text: str, limit: int) -> str:
    """The last `limit` lines of `text`, saying how many came before them."""
    lines = text.strip().splitlines()
    cut = [f"({len(lines) - limit} earlier lines left out)"] if len(lines) > limit else []
    return "\n  ".join([*cut, *lines[-limit:]])


def lock(
    wheel: Path,
    tgt: dict,
    index_url: str | None = None,
    purpose: str = "",
    tail: int = 6,
    hint: str = "",
) -> list[dict]:
    """The packages (pylock.toml [[packages]] tables) the wheel installs with
    on the target, the wheel itself among them (its `archive` is the file).
    A failure names `purpose` (what cannot be done without the set) and the
    last `tail` lines uv wrote, then `hint`; with tail=0 it is one line, uv's last."""
    cmd = [
        _uv(),
        "pip",
        "compile",
        "-",
        "--quiet",
        "--no-header",
        "--no-annotate",
        "--format",
        "pylock.toml",
        "--python-version",
        tgt["python"],
        "--python-platform",
        tgt["platform"],
        "--only-binary",
        ":all:",
        "--no-python-downloads",
        "--python",
        sys.executable,
    ]
    if index_url:
        cmd += ["--default-index", index_url]
    proc = subprocess.run(
        cmd, input=f"vllm @ {wheel.resolve().as_uri()}\n", text=True, capture_output=True
    )
    head = (
        f"uv could not resolve the requirements of {wheel.name} for Python "
        f"{tgt['python']} on {tgt['platform']} from the index, {purpose}"
    )
    if proc.returncode != 0:
        if not tail:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1].strip()
            raise Fail(f"{head} (uv: {last.removeprefix('error: ')}) {hint}".strip())
        raise Fail(f"{head}:\n  " + _tail(proc.stderr, tail) + (f"\n  {hint}" if hint else ""))
    try:
        return tomllib.loads(proc.stdout)["packages"]
    except (tomllib.TOMLDecodeError, KeyError) as e:
        raise Fail(f"{head}: uv's pylock.toml is not readable ({e})") from None


def resolve(wheel: Path, tgt: dict, index_url: str | None = None) -> list[tuple[str, str]]:
    """(name, version) of everything the wheel installs with on the target (uv)."""
    packages = lock(
        wheel,
        tgt,
        index_url,
        "so they cannot be audited",
        hint="(an index of your own: --index-url; a pinned set: --requirements FILE)",
    )
    return [
        # the wheel itself, by its file: its version as the file names it
        (p["name"], wheel.name.split("-")[1] if "archive" in p else p["version"])
        for p in packages
    ]


def target_platforms(platform: str) -> list[str]:
    """The manylinux platform tags a target (`x86_64-manylinux_2_35`) installs,
    its own glibc's first, then every older one and the legacy aliases
    (pip's --platform takes them one by one)."""
    arch, _, glibc = platform.partition("-manylinux_")
    major, minor = map(int, glibc.split("_"))
    platforms = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return platforms + [f"{name}_{arch}" for m, name in legacy.items() if m <= minor]


def target_tags(tgt: dict) -> list[Tag]:
    """The wheel tags the target installs, most specific first (as installers rank them)."""
    platforms = target_platforms(tgt["platform"])
    version = tuple(map(int, tgt["python"].split(".")))
    return [
        *cpython_tags(version, platforms=platforms),
        *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms),
    ]


def pick_wheel(package: dict, tgt: dict) -> dict:
    """The wheel of a locked package that the target installs (its best-ranked tags)."""
    rank = {t: n for n, t in enumerate(target_tags(tgt))}
    best = None
    for w in package.get("wheels", []):
        name = w.get("name") or w["url"].rsplit("/", 1)[-1].split("#")[0]
        tags = parse_wheel_filename(name)[3]
        score = min((rank[t] for t in tags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, w, name)
    if best is None:
        raise Fail(
            f"uv resolved {package['name']} {package.get('version')} but none of its wheels "
            f"installs on Python {tgt['python']} {tgt['platform']}"
        )
    return {**best[1], "name": best[2]}
