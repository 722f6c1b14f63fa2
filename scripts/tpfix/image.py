# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Container image: the official vLLM image with our wheel (Dockerfile).

    python -m tpfix.image                       # image from dist/ (./build.sh first)
    python -m tpfix.image --flashinfer-index URL
    python -m tpfix.image --measure             # + our layer vs a plain reinstall
    ./build.sh --image [same options]             # the wheel, then the image

Stages the build context in build/dists/<dist>-<hash>/image/context/, outside dist/
(the wheel and its SHA256SUMS line from dist/, hash-pinned wheels of the requirements
the series re-pins, the in-build steps scripts/tpfix/image_inside.py), then builds the
Dockerfile with docker (buildx) where an engine answers, otherwise daemonless with buildah or
podman (--isolation chroot) and writes a loadable docker-archive to
dist/image/<name>.tar.  The wheel is checked against SHA256SUMS inside the
build; a missing wheel or a mismatch stops it with a message.  SHA256SUMS may
list other files beside the wheel (SBOM, provenance, index pages): the wheel
is its one top-level `vllm-*.whl` entry, and the context gets only that file
and that line.

Reproducible: two builds from the same commit and the same dist/ give the same
layer and the same image config.  Every timestamp (config `created`, history,
the mtime of every file in the added layer) is SOURCE_DATE_EPOCH: the
environment's if set, otherwise the wheel's own (tpfix.build.source_date_epoch:
the mtime of PKG-INFO in the line's pinned upstream sdist, the value
./build.sh gives setup.py), so wheel and image share one epoch.  buildah /
podman: `--timestamp N --identity-label=false` (no io.buildah.version label),
which also makes the docker-archive `buildah push` writes byte-identical;
docker: `--build-arg SOURCE_DATE_EPOCH=N`, and with buildx
`--output type=docker,rewrite-timestamp=true` (BuildKit >= 0.13) in place of
`--load`.  `image_inventory` lists what the built image holds (base digest,
config and layer digests, every Python distribution) for an SBOM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

from packaging.utils import canonicalize_name

from tpfix.lines import (
    Line,
    Release,
    dist_state,
    get_line,
    image_tag,
    line_names,
    load_pins,
    read_version,
)
from tpfix.package import add_to_dist, check_signer, find_wheel, wheel_entry
from tpfix.patch_format import read_series, series_digest
from tpfix.util import (
    ROOT,
    Fail,
    add_sign_arg,
    host_arch,
    link_or_copy,
    main_wrapper,
    public_url,
    revision,
    run,
    sha256_file,
    shown,
    source_url,
)
from tpfix.wheelfile import wheel_arch, wheel_requirements
from tpfix.worklock import dist_lock

DOCKERFILE = ROOT / "Dockerfile"
INSIDE = Path(__file__).with_name("image_inside.py")


def context_dir(dist: Path) -> Path:
    """The build context of the image made from `dist`: under build/, beside
    the dist lock that covers it (lines.dist_state), never in dist/."""
    return dist_state(dist) / "image" / "context"


CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _step(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


def release_in(dist: Path, line: Line, arch: str | None = None) -> Release:
    """The release a dist folder holds: its wheel for `arch` (None: its only
    one), which must be the line's VERSION, and that wheel's inputs (fetched,
    verified, from the cache)."""
    from tpfix.build import source_date_epoch
    from tpfix.fetch import fetch_sdist, fetch_wheel

    version = read_version(line.version_file)
    wheel, _ = find_wheel(dist, arch)
    if wheel.name.split("-")[1] != version:
        raise Fail(
            f"{wheel} is not version {version} ({shown(line.version_file)}): rerun "
            f"./build.sh --line {line.tag}"
        )
    arch = wheel_arch(wheel)
    check_platform(arch)  # before any download
    sdist = fetch_sdist(line.tag)
    return Release(
        line, version, wheel, sdist, fetch_wheel(arch, line.tag), arch, source_date_epoch(sdist)
    )


def repins(wheel: Path, official: Path) -> list[tuple[str, str]]:
    """(project, version) of each `==` requirement our wheel has and the official lacks."""
    theirs = set(wheel_requirements(official))
    out = []
    for req in wheel_requirements(wheel):
        specs = list(req.specifier)
        if (
            req not in theirs
            and not req.extras
            and len(specs) == 1
            and specs[0].operator == "=="
            and "extra ==" not in str(req.marker or "")
        ):
            out.append((req.name, specs[0].version))
    return out


def pinned_wheel(project: str, version: str) -> Path:
    from tpfix.fetch import all_pin_files, fetch

    norm = canonicalize_name(project)
    for pinfile in all_pin_files():
        for art in load_pins(pinfile):
            if (
                canonicalize_name(art.project) == norm
                and art.version == version
                and art.filename.endswith("-none-any.whl")
            ):
                return fetch(art, pinfile)
    raise Fail(
        f"the series re-pins {project}=={version} but no pure-Python wheel is pinned for "
        "it; add one (filename, size, sha256) to pins/flashinfer.toml or the line's pins.toml"
    )


def series_info(line: Line) -> tuple[list[str], str]:
    """Names in the line's series, and its digest (patch_format.series_digest)."""
    names = read_series(line.series)
    return names, series_digest(names, line.patches)


def stage_context(release: Release, ctx: Path) -> dict[str, str]:
    """Fill `ctx` (made afresh) and return the build arguments the labels need."""
    line, version = release.line, release.version
    wheel, digest = find_wheel(release.dist, release.arch)
    if wheel != release.wheel:
        raise Fail(f"{release.dist / 'SHA256SUMS'} names {wheel.name}, not {release.wheel.name}")
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "dist").mkdir(parents=True)
    link_or_copy(wheel, ctx / "dist" / wheel.name)
    # Only the wheel's line: the other files SHA256SUMS lists (SBOM, provenance,
    # index pages) stay out of the context and so out of the build.
    entry = wheel_entry(release.dist / "SHA256SUMS", release.arch)[2]
    (ctx / "dist" / "SHA256SUMS").write_text(entry + "\n")
    shutil.copy2(INSIDE, ctx / "image_inside.py")
    pins = repins(wheel, release.official)
    if pins:
        (ctx / "wheels").mkdir()
        lines = []
        for project, pin in pins:
            w = pinned_wheel(project, pin)
            link_or_copy(w, ctx / "wheels" / w.name)
            lines.append(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n")
        (ctx / "wheels" / "SHA256SUMS").write_text("".join(lines))
    names, series_sha = series_info(line)
    return {
        "VERSION": version,
        "REVISION": revision(),
        "SOURCE": source_url(),
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


# The OCI platform of each official arch: what the engine builds for.
PLATFORMS = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
# binfmt_misc entries (qemu-user-static, binfmt-support) that run another arch's
# binaries: the base image's python3 runs in the build (image_inside.py).
BINFMT = Path("/proc/sys/fs/binfmt_misc")
EMULATORS = {"x86_64": "qemu-x86_64", "aarch64": "qemu-aarch64"}


def check_platform(arch: str) -> None:
    """Stop before any download when this host cannot run `arch`'s binaries,
    which the image build does (the base image's python3): a host of that
    arch, or one with its qemu binfmt entry enabled."""
    if arch == host_arch():
        return
    entry = BINFMT / EMULATORS[arch]
    try:
        enabled = entry.read_text().splitlines()[0] == "enabled"
    except (OSError, IndexError):
        enabled = False
    if not enabled:
        raise Fail(
            f"an image for {PLATFORMS[arch]} ({arch}) runs the base image's python3 in "
            f"the build, and this {host_arch()} host cannot run {arch} binaries "
            f"({entry} is missing or disabled): register the emulator (Debian: apt-get "
            f"install qemu-user-static binfmt-support), or build the image on an {arch} host"
        )


def build_cmd(
    eng: Engine,
    dockerfile: Path,
    ctx: Path,
    tag: str,
    args: dict[str, str],
    epoch: int | None = None,
    arch: str | None = None,
) -> list[str]:
    """The build command for `arch`'s platform (None: the engine's default);
    with `epoch`, a reproducible one (every timestamp is `epoch`, no
    build-host identity)."""
    args = dict(args)
    if eng.name == "docker":
        if not eng.buildx:
            cmd = [eng.exe, "build"]
        elif epoch is None:
            cmd = [eng.exe, "buildx", "build", "--load"]
        else:  # --load, with file mtimes clamped to SOURCE_DATE_EPOCH too
            cmd = [eng.exe, "buildx", "build", "--output", "type=docker,rewrite-timestamp=true"]
        if epoch is not None:
            args["SOURCE_DATE_EPOCH"] = str(epoch)  # BuildKit: config and history times
    else:
        cmd = [eng.exe, "bud" if eng.name == "buildah" else "build", "--isolation", "chroot"]
        if epoch is not None:
            cmd += ["--timestamp", str(epoch), "--identity-label=false"]
    if eng.daemonless and CA_BUNDLE.exists():
        # pip inside a chroot build (FlashInfer's index) needs the host's CAs.
        cmd += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    if arch is not None:
        cmd += ["--platform", PLATFORMS[arch]]
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
    proc = run(cmd, env=env)
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


# --- inventory (for an SBOM) -------------------------------------------------------

# Run by the image's own python3 (stdlib only, Python >= 3.8): every installed
# distribution, one JSON list on stdout.
_LIST_DISTS = """
import json, sys
from importlib import metadata
out = []
for d in metadata.distributions():
    name = d.metadata["Name"]
    if name:
        out.append({"name": name, "version": d.version, "location": str(d.locate_file(""))})
out.sort(key=lambda e: (e["name"].lower(), e["location"]))
json.dump(out, sys.stdout)
"""


def _image_json(eng: Engine, ref: str) -> dict | None:
    cmd = (
        [eng.exe, "inspect", "--type", "image", ref]
        if eng.name == "buildah"
        else [eng.exe, "image", "inspect", ref]
    )
    proc = run(cmd)
    if proc.returncode != 0:
        return None
    d = json.loads(proc.stdout)
    return d[0] if isinstance(d, list) else d


def _base_digest(eng: Engine, base: str) -> str | None:
    """The base's manifest digest as local storage knows it (None: not there, or
    built locally and never pulled, for docker)."""
    d = _image_json(eng, base)
    if d is None:
        return None
    if eng.name == "buildah":
        return d.get("FromImageDigest") or None
    if eng.name == "podman" and d.get("Digest"):
        return d["Digest"]
    # "repo@sha256:...", set when pulled: the one of the base's own repository
    repo = base.split("@")[0].rsplit(":", 1)[0] if ":" in base.rsplit("/", 1)[-1] else base
    digests = [x.split("@", 1) for x in d.get("RepoDigests") or [] if "@" in x]
    mine = [dg for name, dg in digests if name.endswith(repo.split("/", 1)[-1])]
    return mine[0] if mine else None


def _python_dists(eng: Engine, ref: str) -> list[dict]:
    if eng.name == "buildah":
        proc = run([eng.exe, "from", "--pull=never", "--quiet", ref])
        if proc.returncode != 0:
            raise Fail(f"buildah cannot use {ref}: {proc.stderr.strip()}")
        ctr = proc.stdout.strip()
        try:
            proc = run(
                [eng.exe, "run", "--isolation", "chroot", ctr, "--", "python3", "-c", _LIST_DISTS]
            )
        finally:
            run([eng.exe, "rm", ctr])
    else:
        cmd = [eng.exe, "run", "--rm", "--network", "none", "--entrypoint", "python3"]
        proc = run([*cmd, ref, "-c", _LIST_DISTS])
    if proc.returncode != 0:
        raise Fail(f"could not list the Python distributions of {ref}: {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def image_inventory(eng: Engine, ref: str, base: str) -> dict:
    """What the built image `ref` holds, read from the image itself (for an SBOM):

    {"base": {"name": base, "digest": "sha256:..." or None},
     "image": {"ref": ref, "config_digest": "sha256:...", "layers": ["sha256:...", ...]},
     "python": [{"name", "version", "location"}, ...]}

    `layers`: the uncompressed layer digests, base first (config rootfs.diff_ids;
    in buildah's local storage also the manifest's layer digests).  `python`:
    every distribution importlib.metadata finds with the image's python3, sorted
    by name; `location` is the site-packages folder holding its metadata.  The
    working container is always removed (buildah rm; docker/podman run --rm).
    """
    d = _image_json(eng, ref)
    if d is None:
        raise Fail(f"{eng.name} has no image {ref}")
    if eng.name == "buildah":
        config_digest = json.loads(d["Manifest"])["config"]["digest"]
        layers = d["OCIv1"]["rootfs"]["diff_ids"]
    else:
        config_digest, layers = d["Id"], d["RootFS"]["Layers"]
        if not config_digest.startswith("sha256:"):
            config_digest = "sha256:" + config_digest
    return {
        "base": {"name": base, "digest": _base_digest(eng, base)},
        "image": {"ref": ref, "config_digest": config_digest, "layers": list(layers)},
        "python": _python_dists(eng, ref),
    }


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
    epoch: int  # the SOURCE_DATE_EPOCH it was built with


def build_image(
    release: Release,
    base: str | None = None,
    tag: str | None = None,
    flashinfer_index: str = "",
    archive_dir: Path | None = None,
    engine: str = "auto",
    ctx: Path | None = None,
) -> Built:
    """The image of `release` on `base` (default: the line's official image)."""
    dist = release.dist
    base = base or release.line.official_image
    ctx = ctx or context_dir(dist)
    eng = detect_engine(engine)
    tag = tag or image_tag(release.version)
    _step(f"image: stage the build context in {ctx}")
    args = stage_context(release, ctx)
    args.update(BASE_IMAGE=base, FLASHINFER_INDEX_URL=flashinfer_index)
    epoch = release.epoch
    _step(f"image: build {tag} on {base} ({eng.name}, SOURCE_DATE_EPOCH={epoch})")
    t0 = time.monotonic()
    cmd = build_cmd(eng, DOCKERFILE, ctx, tag, args, epoch, release.arch)
    out = run_build(eng, cmd, ctx.parent / "image.log")
    seconds = time.monotonic() - t0
    for said in out.splitlines():
        if said.startswith("image: "):
            print(said, file=sys.stderr)
    archive = None
    if eng.daemonless and archive_dir is not None:
        name = tag.rsplit("/", 1)[-1].replace(":", "-")
        _step(f"image: write {archive_dir / (name + '.tar')}")
        archive = save_archive(eng, tag, archive_dir / f"{name}.tar")
    return Built(tag, eng, archive, out, seconds, dist, ctx, epoch)


def describe_image(
    built: Built, release: Release, base: str, signer=None, flashinfer_index: str = ""
) -> list[Path]:
    """SBOM and provenance of an image built by tpfix.image (a `Built`), in
    <dist>/image/ beside its archive, then SHA256SUMS with them added.

    The statement's subjects: the image by its config digest (the image ID;
    a registry's manifest digest exists only once it is pushed: attest that
    one where you push, e.g. `cosign attest`) and the docker-archive file."""
    from tpfix import attest, image_sbom, sbom, wheel_sbom

    dist = built.dist
    line, wheel, sdist, official = release.line, release.wheel, release.sdist, release.official
    epoch = built.epoch
    inv = image_inventory(built.engine, built.ref, base)
    version = release.version
    name = built.ref.rsplit("/", 1)[-1].replace(":", "-")
    wheel_c = wheel_sbom.wheel_component(wheel, line, sdist, official)
    platform = PLATFORMS[release.arch]
    bom = image_sbom.image_bom(inv, wheel_c, epoch, version, line.tag, name, platform)
    folder = Path("image")
    texts = {folder / f"{name}.cdx.json": sbom.dumps(bom)}
    subjects = [(built.ref, inv["image"]["config_digest"])]
    if built.archive is not None:
        subjects.append((built.archive.name, sha256_file(built.archive)))
    base_dep = (
        [attest.resource_descriptor(base, inv["base"]["digest"], f"docker://{base}")]
        if inv["base"]["digest"]
        else [attest.ResourceDescriptor(name=base, uri=f"docker://{base}")]
    )
    deps = [*base_dep, attest.file_dep(wheel), *attest.upstream_deps(line, sdist, official)]
    external = {
        "command": attest.build_command(),
        "line": line.tag,
        "base": base,
        "platform": platform,
        "version": version,
        "flashinfer index": public_url(flashinfer_index),
    }
    stmt = attest.statement("image", subjects, external, deps, epoch)
    statement = folder / f"{name}.provenance.json"
    texts[statement] = attest.dumps(stmt)
    if signer is not None:
        texts[folder / attest.signed_name(statement.name)] = attest.sign(
            texts[statement].encode(), signer
        )
    archive = built.archive
    also = [folder / archive.name] if archive and archive.parent == dist / folder else []
    written = add_to_dist(dist, texts, also, replacing="image", signer=signer)
    return written + [dist / p for p in also]


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
        "--base", help="base image (default vllm/vllm-openai:<line's tag>, the official one)"
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


def image_from_args(args: argparse.Namespace, release: Release) -> Built:
    dist = release.dist
    built = build_image(
        release,
        base=args.base,
        tag=args.tag,
        flashinfer_index=args.flashinfer_index,
        archive_dir=None if args.no_archive else (args.image_dir or dist / "image"),
        engine=args.engine,
    )
    print(built.ref)
    if built.archive:
        print(built.archive)
    _step("image: SBOM, provenance" + (" (signed)" if args.signer else ""))
    base = args.base or release.line.official_image
    for path in describe_image(built, release, base, args.signer, args.flashinfer_index):
        print(path)
    return built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--line", choices=line_names(), help="release line (default: VERSION's)")
    ap.add_argument("--dist", type=Path, help="default dist/ (dist/TAG/ for another line)")
    add_image_args(ap)
    add_sign_arg(ap)
    ap.add_argument(
        "--arch", choices=["x86_64", "aarch64"], help="the wheel of dist/ (default: its only one)"
    )
    ap.add_argument("--measure", action="store_true", help="compare our layer with a reinstall")
    args = ap.parse_args()
    from tpfix.attest import signing_key

    args.signer = signing_key(args.sign_key)
    line = args.line = get_line(args.line)
    args.dist = args.dist or line.dist
    # The image is made from dist/'s wheel: no build may replace it meanwhile.
    with dist_lock(args.dist, "build the image from another folder: --dist DIR"):
        check_signer(args.dist, args.signer)  # its files go into a signed dist/
        built = image_from_args(args, release_in(args.dist, line, args.arch))
    if args.measure:
        sizes = measure(built, args.base or line.official_image)
        print(f"layers added to the base: {sizes.pop('layers added')}")
        for what, size in sizes.items():
            print(f"{what:>22}: {size / 1e6:10.2f} MB  ({size} bytes, uncompressed layer)")


if __name__ == "__main__":
    main_wrapper(main)
