# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Container image: the official vLLM image with our wheel (Dockerfile).

    python -m tpfix.image                       # image from dist/ (./build.sh first)
    python -m tpfix.image --flashinfer-index URL
    python -m tpfix.image --measure             # + our layer vs a plain reinstall
    ./build.sh --image [same options]             # the wheel, then the image

Stages the build context in .<dist>-image/context/ beside dist/ (the wheel and SHA256SUMS
from dist/, hash-pinned wheels of the requirements the series re-pins, the
in-build steps scripts/tpfix/image_inside.py), then builds the Dockerfile with
docker (buildx) where an engine answers, otherwise daemonless with buildah or
podman (--isolation chroot) and writes a loadable docker-archive to
dist/image/<name>.tar.  The wheel is checked against SHA256SUMS inside the
build; a missing wheel or a mismatch stops it with a message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

from tpfix.common import (
    ROOT,
    Fail,
    Line,
    get_line,
    host_arch,
    line_names,
    load_pins,
    main_wrapper,
    read_version,
    run,
    shown,
)
from tpfix.patchfile import read_series, series_digest
from tpfix.worklock import dist_lock

DOCKERFILE = ROOT / "Dockerfile"
INSIDE = Path(__file__).with_name("image_inside.py")


def default_base(line: Line | None = None) -> str:
    """The official image of the line's tag (the default line's by default)."""
    return f"vllm/vllm-openai:{(line or get_line()).tag}"


def context_dir(dist: Path) -> Path:
    """The build context of the image made from `dist`: beside it, like its
    staging folder, so that the dist lock (worklock) covers it too."""
    dist = dist.resolve()
    return dist.parent / f".{dist.name}-image" / "context"


CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _step(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


def default_tag(version: str | None = None) -> str:
    return f"vllm-openai:v{(version or read_version()).replace('+', '-')}"


def find_wheel(dist: Path) -> tuple[Path, str]:
    """The wheel SHA256SUMS names (the in-build check repeats this)."""
    sums = dist / "SHA256SUMS"
    if not sums.exists():
        raise Fail(f"{sums} is missing: build the wheel first (./build.sh)")
    entries = [line.split() for line in sums.read_text().splitlines() if line.strip()]
    wheels = [(n.lstrip("*"), h) for h, n in entries if n.lstrip("*").startswith("vllm-")]
    if len(wheels) != 1:
        raise Fail(f"{sums} lists {len(wheels)} vllm wheels, expected one; rerun ./build.sh")
    name, digest = wheels[0]
    if not (dist / name).exists():
        raise Fail(f"{dist / name} (listed in {sums}) is missing: rerun ./build.sh")
    return dist / name, digest


def requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-")]


def repins(wheel: Path, official: Path) -> list[tuple[str, str]]:
    """(project, version) of each `==` requirement our wheel has and the official lacks."""
    theirs = set(requires(official))
    out = []
    for req in requires(wheel):
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;,]+)\s*(;.*)?$", req)
        if req not in theirs and m and "extra ==" not in (m.group(3) or ""):
            out.append((m.group(1), m.group(2)))
    return out


def pinned_wheel(project: str, version: str) -> Path:
    from tpfix.fetch import all_pin_files, fetch

    norm = re.sub(r"[-_.]+", "-", project).lower()
    for pinfile in all_pin_files():
        for art in load_pins(pinfile):
            if (
                re.sub(r"[-_.]+", "-", art.project).lower() == norm
                and art.version == version
                and art.filename.endswith("-none-any.whl")
            ):
                return fetch(art, pinfile)
    raise Fail(
        f"the series re-pins {project}=={version} but pins/ has no pure-Python wheel "
        f"pinned for it; add one (filename, size, sha256) to pins/*.toml or the line's pins.toml"
    )


def series_info(line: Line | None = None) -> tuple[list[str], str]:
    """Names in the line's series, and its digest (patchfile.series_digest)."""
    line = line or get_line()
    names = read_series(line.series)
    return names, series_digest(names, line.patches)


def _git(*args: str) -> str:
    proc = run(["git", "-C", str(ROOT), *args])
    return proc.stdout.strip() if proc.returncode == 0 else ""


def revision() -> str:
    head = _git("rev-parse", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if dirty else "")


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def stage_context(dist: Path, ctx: Path, arch: str, line: Line | None = None) -> dict[str, str]:
    """Fill `ctx` (made afresh) and return the build arguments the labels need."""
    from tpfix.fetch import fetch_wheel

    line = line or get_line()
    version = read_version(line.version_file)
    wheel, digest = find_wheel(dist)
    if wheel.name.split("-")[1] != version:
        raise Fail(
            f"{wheel} is not version {version} ({shown(line.version_file)}): rerun ./build.sh"
            + ("" if line.is_default else f" --line {line.tag}")
        )
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "dist").mkdir(parents=True)
    _link_or_copy(wheel, ctx / "dist" / wheel.name)
    shutil.copy2(dist / "SHA256SUMS", ctx / "dist" / "SHA256SUMS")
    shutil.copy2(INSIDE, ctx / "image_inside.py")
    pins = repins(wheel, fetch_wheel(arch, line.tag))
    if pins:
        (ctx / "wheels").mkdir()
        lines = []
        for project, pin in pins:
            w = pinned_wheel(project, pin)
            _link_or_copy(w, ctx / "wheels" / w.name)
            lines.append(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n")
        (ctx / "wheels" / "SHA256SUMS").write_text("".join(lines))
    names, series_sha = series_info(line)
    return {
        "VERSION": version,
        "REVISION": revision(),
        "SOURCE": _git("remote", "get-url", "origin"),
        "UPSTREAM_TAG": line.tag,
        "SERIES": " ".join(names),
        "SERIES_SHA256": series_sha,
        "WHEEL_SHA256": digest,
    }


# --- engines -----------------------------------------------------------------


@dataclass
class Engine:
    name: str  # docker, buildah or podman
    exe: str
    buildx: bool = False

    @property
    def daemonless(self) -> bool:
        return self.name != "docker"


def detect_engine(prefer: str = "auto") -> Engine:
    def docker() -> Engine | None:
        exe = shutil.which("docker")
        try:
            if not exe or run([exe, "info"], timeout=30).returncode != 0:
                return None  # a client without an engine
        except subprocess.TimeoutExpired:
            return None
        return Engine("docker", exe, buildx=run([exe, "buildx", "version"]).returncode == 0)

    def daemonless(name: str) -> Engine | None:
        exe = shutil.which(name)
        return Engine(name, exe) if exe else None

    order = {"auto": ["docker", "buildah", "podman"]}.get(prefer, [prefer])
    for name in order:
        eng = docker() if name == "docker" else daemonless(name)
        if eng:
            return eng
    raise Fail(
        "no image builder: need a running docker engine, or buildah / podman "
        "(Debian: apt-get install buildah)"
        if prefer == "auto"
        else f"{prefer} is not usable here"
    )


def build_cmd(
    eng: Engine, dockerfile: Path, ctx: Path, tag: str, args: dict[str, str]
) -> list[str]:
    if eng.name == "docker":
        cmd = [eng.exe, "buildx", "build", "--load"] if eng.buildx else [eng.exe, "build"]
    elif eng.name == "buildah":
        cmd = [eng.exe, "bud", "--isolation", "chroot"]
    else:
        cmd = [eng.exe, "build", "--isolation", "chroot"]
    if eng.daemonless and CA_BUNDLE.exists():
        # pip inside a chroot build (FlashInfer's index) needs the host's CAs.
        cmd += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    cmd += ["-f", str(dockerfile), "-t", tag]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    return [*cmd, str(ctx)]


def _error_of(out: str) -> str:
    """The message image_inside.py printed ("image: error: ..." and its indented lines)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "image: error: " in line:
            block = [line.split("image: error: ", 1)[1]]
            block += list(takewhile(lambda ln: ln.startswith("  "), lines[i + 1 :]))[:40]
            return "\n".join(block)
    return ""


def run_build(eng: Engine, cmd: list[str], log: Path | None = None) -> str:
    env = dict(os.environ, DOCKER_BUILDKIT="1")  # RUN --mount needs BuildKit
    proc = subprocess.run(cmd, text=True, capture_output=True, env=env)
    out = proc.stdout + proc.stderr
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(out)
    if proc.returncode != 0:
        detail = _error_of(out) or "\n".join(out.strip().splitlines()[-15:])
        raise Fail(f"image build failed ({eng.name}):\n{detail}")
    return out


def inspect(eng: Engine, ref: str) -> dict:
    """{'config': OCI config (Labels, Entrypoint, ...), 'layers': [uncompressed sizes]}."""
    if eng.name == "docker":
        d = json.loads(run([eng.exe, "image", "inspect", ref]).stdout)[0]
        hist = run([eng.exe, "history", "--no-trunc", "-H=false", "--format", "{{.Size}}", ref])
        sizes = [int(s) for s in reversed(hist.stdout.split()) if s.isdigit() and int(s) > 0]
        return {"config": d["Config"], "layers": sizes}
    proc = run(
        [eng.exe, "inspect", "--type", "image", ref]
        if eng.name == "buildah"
        else [eng.exe, "image", "inspect", ref]
    )
    if proc.returncode != 0:
        raise Fail(f"{eng.name} cannot inspect {ref}: {proc.stderr.strip()}")
    d = json.loads(proc.stdout)
    if isinstance(d, list):  # podman: configuration only
        return {"config": d[0]["Config"], "layers": []}
    manifest = json.loads(d["Manifest"])
    return {"config": d["OCIv1"]["config"], "layers": [x["size"] for x in manifest["layers"]]}


def image_exists(eng: Engine, ref: str) -> bool:
    if eng.name == "buildah":
        return run([eng.exe, "inspect", "--type", "image", ref]).returncode == 0
    return run([eng.exe, "image", "inspect", ref]).returncode == 0


def save_archive(eng: Engine, ref: str, out: Path) -> Path:
    """A docker-archive (`docker load -i` / `podman load -i`), written atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    tmp.unlink(missing_ok=True)
    if eng.name == "buildah":
        cmd = [eng.exe, "push", "--quiet", ref, f"docker-archive:{tmp}:{ref}"]
    else:
        cmd = [eng.exe, "save", "--format", "docker-archive", "-o", str(tmp), ref]
    proc = run(cmd)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise Fail(f"could not write {out}: {proc.stderr.strip()[-2000:]}")
    os.replace(tmp, out)
    return out


# --- the whole job ---------------------------------------------------------------


@dataclass
class Built:
    ref: str
    engine: Engine
    archive: Path | None
    output: str
    seconds: float
    dist: Path
    ctx: Path


def build_image(
    dist: Path = ROOT / "dist",
    base: str | None = None,
    tag: str | None = None,
    flashinfer_index: str = "",
    archive_dir: Path | None = ROOT / "dist" / "image",
    engine: str = "auto",
    ctx: Path | None = None,
    arch: str | None = None,
    line: Line | None = None,
) -> Built:
    line = line or get_line()
    base = base or default_base(line)
    ctx = ctx or context_dir(dist)
    eng = detect_engine(engine)
    tag = tag or default_tag(read_version(line.version_file))
    _step(f"image: stage the build context in {ctx}")
    args = stage_context(dist, ctx, arch or host_arch(), line)
    args.update(BASE_IMAGE=base, FLASHINFER_INDEX_URL=flashinfer_index)
    _step(f"image: build {tag} on {base} ({eng.name})")
    t0 = time.monotonic()
    out = run_build(eng, build_cmd(eng, DOCKERFILE, ctx, tag, args), ctx.parent / "image.log")
    seconds = time.monotonic() - t0
    for said in out.splitlines():
        if said.startswith("image: "):
            print(said, file=sys.stderr)
    archive = None
    if eng.daemonless and archive_dir is not None:
        name = tag.rsplit("/", 1)[-1].replace(":", "-")
        _step(f"image: write {archive_dir / (name + '.tar')}")
        archive = save_archive(eng, tag, archive_dir / f"{name}.tar")
    return Built(tag, eng, archive, out, seconds, dist, ctx)


_PLAIN = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG PYTHON=python3
ARG COMPILE=--compile
RUN --mount=type=bind,source=.,target=/ctx \\
    ${PYTHON} -m pip install --no-deps --force-reinstall --no-index \\
        --disable-pip-version-check ${COMPILE} /ctx/dist/*.whl $(ls /ctx/wheels/*.whl 2>/dev/null)
"""


def measure(built: Built, base: str) -> dict[str, int]:
    """Top-layer sizes: ours vs `pip install --force-reinstall --no-deps` of the wheel."""
    eng = built.engine
    sizes = {"ours": inspect(eng, built.ref)["layers"][-1]}
    base_layers = len(inspect(eng, base)["layers"])
    ours_layers = len(inspect(eng, built.ref)["layers"])
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "Containerfile.plain"
        plain.write_text(_PLAIN)
        for compile_ in ("--compile", "--no-compile"):
            ref = f"{built.ref}-plain{compile_.replace('--', '-')}"
            _step(f"measure: plain pip install {compile_} ({ref})")
            run_build(
                eng,
                build_cmd(eng, plain, built.ctx, ref, {"BASE_IMAGE": base, "COMPILE": compile_}),
            )
            sizes[f"plain {compile_}"] = inspect(eng, ref)["layers"][-1]
    sizes["layers added"] = ours_layers - base_layers
    return sizes


def add_image_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("container image")
    g.add_argument(
        "--base", help=f"base image (default vllm/vllm-openai:<line's tag>, {default_base()})"
    )
    g.add_argument("--tag", help="image name (default vllm-openai:v<VERSION with - for +>)")
    g.add_argument(
        "--flashinfer-index",
        default=os.environ.get("FLASHINFER_INDEX_URL", ""),
        help="FlashInfer's wheel index, the one vLLM's own docker/Dockerfile uses "
        "(needed when the base ships flashinfer-cubin / flashinfer-jit-cache; "
        "default: $FLASHINFER_INDEX_URL)",
    )
    g.add_argument("--engine", default="auto", choices=["auto", "docker", "buildah", "podman"])
    g.add_argument(
        "--image-dir",
        type=Path,
        help="where the docker-archive goes without an engine (default: <dist>/image)",
    )
    g.add_argument("--no-archive", action="store_true", help="keep the image in local storage only")


def image_from_args(args: argparse.Namespace, dist: Path) -> Built:
    built = build_image(
        dist=dist,
        base=args.base,
        tag=args.tag,
        flashinfer_index=args.flashinfer_index,
        archive_dir=None if args.no_archive else (args.image_dir or dist / "image"),
        engine=args.engine,
        arch=getattr(args, "arch", None),
        line=args.line,
    )
    print(built.ref)
    if built.archive:
        print(built.archive)
    return built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--line", choices=line_names(), help="release line (default: VERSION's)")
    ap.add_argument("--dist", type=Path, help="default dist/ (dist/TAG/ for another line)")
    add_image_args(ap)
    ap.add_argument("--measure", action="store_true", help="compare our layer with a reinstall")
    args = ap.parse_args()
    line = args.line = get_line(args.line)
    args.dist = args.dist or line.dist
    # The image is made from dist/'s wheel: no build may replace it meanwhile.
    with dist_lock(args.dist, "build the image from another folder: --dist DIR"):
        built = image_from_args(args, args.dist)
    if args.measure:
        sizes = measure(built, args.base or default_base(line))
        print(f"layers added to the base: {sizes.pop('layers added')}")
        for what, size in sizes.items():
            print(f"{what:>22}: {size / 1e6:10.2f} MB  ({size} bytes, uncompressed layer)")


if __name__ == "__main__":
    main_wrapper(main)
