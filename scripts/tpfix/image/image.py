# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Container image: the official vLLM image with our wheel (Dockerfile).

    python -m tpfix.image                       # image from dist/ (./build.sh first)
    python -m tpfix.image --flashinfer-index URL
    python -m tpfix.image --measure             # + our layer vs a plain reinstall
    ./build.sh --image [same options]             # the wheel, then the image

Stages the build context in build/dists/<dist>-<hash>/image/context/, outside dist/
(the wheel and its SHA256SUMS line from dist/, hash-pinned wheels of the requirements
the series re-pins, the in-build steps scripts/tpfix/image/image_inside.py), then builds the
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
environment's if set, otherwise the wheel's own (tpfix.stages.build.source_date_epoch:
the mtime of PKG-INFO in the line's pinned upstream sdist, the value
./build.sh gives setup.py), so wheel and image share one epoch.  buildah /
podman: `--timestamp N --identity-label=false` (no io.buildah.version label),
which also makes the docker-archive `buildah push` writes byte-identical;
docker: `--build-arg SOURCE_DATE_EPOCH=N`, and with buildx
`--output type=docker,rewrite-timestamp=true` (BuildKit >= 0.13) in place of
`--load`.  The engines themselves (detection, the build command, inspect,
the docker-archive, and `image_inventory`: what the built image holds, for
its SBOM) are tpfix.image.image_engine; the image's SBOM is tpfix.image.image_sbom.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from packaging.utils import canonicalize_name

from tpfix.core.context import BuildContext, Release
from tpfix.core.lines import dist_state, get_line, image_tag, line_names, load_pins, wheel_arches
from tpfix.core.patch_format import series_digest
from tpfix.core.util import (
    ROOT,
    Fail,
    add_sign_arg,
    link_or_copy,
    main_wrapper,
    public_url,
    revision,
    sha256_file,
    shown,
    source_url,
)
from tpfix.core.wheelfile import wheel_arch, wheel_requirements
from tpfix.core.worklock import dist_lock
from tpfix.image.image_engine import (
    PLATFORMS,
    Built,
    build_cmd,
    check_platform,
    detect_engine,
    image_inventory,
    inspect,
    list_engine,
    run_build,
    save_archive,
)
from tpfix.image.image_list import build_list, describe_list
from tpfix.stages.package import (
    IMAGE,
    add_image_files,
    check_signer,
    clear_staging,
    find_wheel,
    image_arch,
    image_name,
    replaced_by_image,
    wheel_entry,
)

DOCKERFILE = ROOT / "Dockerfile"
INSIDE = Path(__file__).with_name("image_inside.py")


def context_dir(dist: Path) -> Path:
    """The build context of the image made from `dist`: under build/, beside
    the dist lock that covers it (lines.dist_state), never in dist/."""
    return dist_state(dist) / "image" / "context"


def _step(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


def release_in(
    dist: Path, ctx: BuildContext, arch: str | None = None, wheel: Path | None = None
) -> Release:
    """The release a dist folder holds: its wheel for `arch` (None: its only
    one; or `wheel`, found there already), which must be the context's
    version, and that wheel's inputs (fetched, verified, from the cache)."""
    from tpfix.stages.build import source_date_epoch
    from tpfix.stages.fetch import fetch_inputs

    line, version = ctx.line, ctx.version
    wheel = wheel or find_wheel(dist, arch)[0]
    if wheel.name.split("-")[1] != version:
        raise Fail(
            f"{wheel} is not version {version} ({shown(line.version_file)}): rerun "
            f"./build.sh --line {line.tag}"
        )
    arch = wheel_arch(wheel)
    check_platform(arch)  # before any download
    sdist, official = fetch_inputs(ctx, arch)
    return Release(ctx, wheel, sdist, official, arch, source_date_epoch(sdist))


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
    from tpfix.stages.fetch import all_pin_files, fetch

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


def series_info(ctx: BuildContext) -> tuple[list[str], str]:
    """Names in the context's series, and its digest (patch_format.series_digest)."""
    names = list(ctx.series)
    return names, series_digest(names, ctx.line.patches)


def stage_context(release: Release, ctx: Path) -> dict[str, str]:
    """Fill `ctx` (made afresh) and return the build arguments the labels need."""
    line, version = release.line, release.version
    sums = release.dist / "SHA256SUMS"
    if not sums.exists():
        raise Fail(f"{sums} is missing: build the wheel first (./build.sh)")
    name, digest, entry = wheel_entry(sums, release.arch)  # the one read of SHA256SUMS here
    wheel = release.dist / name
    if wheel != release.wheel:
        raise Fail(f"{sums} names {name}, not {release.wheel.name}")
    if not wheel.exists():
        raise Fail(f"{wheel} (listed in {sums}) is missing: rerun ./build.sh")
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "dist").mkdir(parents=True)
    link_or_copy(wheel, ctx / "dist" / wheel.name)
    # Only the wheel's line: the other files SHA256SUMS lists (SBOM, provenance,
    # index pages) stay out of the context and so out of the build.
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
    names, series_sha = series_info(release.ctx)
    return {
        "VERSION": version,
        "REVISION": revision(),
        "SOURCE": source_url(),
        "UPSTREAM_TAG": line.tag,
        "SERIES": " ".join(names),
        "SERIES_SHA256": series_sha,
        "WHEEL_SHA256": digest,
    }


# --- the whole job ---------------------------------------------------------------


def build_image(
    release: Release,
    base: str | None = None,
    tag: str | None = None,
    flashinfer_index: str = "",
    archive_dir: Path | None = None,
    engine: str = "auto",
    ctx: Path | None = None,
    arch_in_ref: bool = False,
) -> Built:
    """The image of `release` on `base` (default: the line's official image),
    for the release's arch; named `tag`, or `<tag>-<arch>` with `arch_in_ref`
    (one of the images a manifest list `tag` joins)."""
    dist, arch = release.dist, release.arch
    base = base or release.line.official_image
    ctx = ctx or context_dir(dist)
    eng = detect_engine(engine)
    tag = tag or image_tag(release.version)
    ref = f"{tag}-{arch}" if arch_in_ref else tag
    _step(f"image: stage the build context in {ctx}")
    args = stage_context(release, ctx)
    args.update(BASE_IMAGE=base, FLASHINFER_INDEX_URL=flashinfer_index)
    epoch = release.epoch
    _step(
        f"image: build {ref} ({PLATFORMS[arch]}) on {base} ({eng.name}, SOURCE_DATE_EPOCH={epoch})"
    )
    t0 = time.monotonic()
    cmd = build_cmd(eng, DOCKERFILE, ctx, ref, args, epoch, arch)
    out = run_build(eng, cmd, ctx.parent / "image.log")
    seconds = time.monotonic() - t0
    for said in out.splitlines():
        if said.startswith("image: "):
            print(said, file=sys.stderr)
    archive = None
    if eng.daemonless and archive_dir is not None:
        path = archive_dir / f"{image_name(tag, arch)}.tar"
        _step(f"image: write {path}")
        archive = save_archive(eng, ref, path, name=tag)  # `docker load`: <tag>
    return Built(ref, eng, archive, out, seconds, dist, ctx, epoch, tag, arch)


def describe_image(
    built: Built, release: Release, base: str, signer=None, flashinfer_index: str = ""
) -> list[Path]:
    """SBOM and provenance of an image built by tpfix.image.image (a `Built`), in
    <dist>/image/ beside its archive, then SHA256SUMS with them added.

    The statement's subjects: the image by its config digest (the image ID;
    a registry's manifest digest exists only once it is pushed: attest that
    one where you push, e.g. `cosign attest`) and the docker-archive file."""
    from tpfix.image import image_sbom
    from tpfix.release import attest, sbom, wheel_sbom

    dist = built.dist
    line, wheel, sdist, official = release.line, release.wheel, release.sdist, release.official
    epoch = built.epoch
    inv = image_inventory(built.engine, built.ref, base)
    version = release.version
    name = image_name(built.tag, built.arch)
    wheel_c = wheel_sbom.wheel_component(wheel, release.ctx, sdist, official)
    platform = PLATFORMS[release.arch]
    bom = image_sbom.image_bom(inv, wheel_c, epoch, version, line.tag, name, platform)
    folder = Path(IMAGE)
    texts = {folder / f"{name}.cdx.json": sbom.dumps(bom)}
    subjects = [(built.tag, inv["image"]["config_digest"])]
    if built.archive is not None:
        subjects.append((built.archive.name, sha256_file(built.archive)))
    base_dep = (
        [attest.resource_descriptor(base, inv["base"]["digest"], f"docker://{base}")]
        if inv["base"]["digest"]
        else [attest.ResourceDescriptor(name=base, uri=f"docker://{base}")]
    )
    deps = [*base_dep, attest.file_dep(wheel), *attest.upstream_deps(release.ctx, sdist, official)]
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
    replacing = replaced_by_image(built.arch)  # and the manifest list's files
    return add_image_files(dist, texts, statement, built.archive, replacing, signer)


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
            args = {"BASE_IMAGE": base, "COMPILE": compile_}
            run_build(eng, build_cmd(eng, plain, built.ctx, ref, args, arch=built.arch))
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


def image_from_args(args: argparse.Namespace, releases: list[Release]) -> list[Built]:
    """The image of each release (one per arch), with its SBOM and provenance;
    for more than one, each named `<tag>-<arch>` and a manifest list `<tag>`
    over them (--arch all)."""
    dist = releases[0].dist
    archive_dir = None if args.no_archive else (args.image_dir or dist / IMAGE)
    base = args.base or releases[0].line.official_image
    builts = []
    for release in releases:
        built = build_image(
            release,
            base=args.base,
            tag=args.tag,
            flashinfer_index=args.flashinfer_index,
            archive_dir=archive_dir,
            engine=args.engine,
            arch_in_ref=len(releases) > 1,
        )
        print(built.ref)
        if built.archive:
            print(built.archive)
        _step("image: SBOM, provenance" + (" (signed)" if args.signer else ""))
        for path in describe_image(built, release, base, args.signer, args.flashinfer_index):
            print(path)
        builts.append(built)
    if len(builts) > 1:
        lst = build_list(builts, archive_dir)
        print(lst.ref)
        if lst.archive is None:
            _step(
                f"image: {lst.ref} is in local storage only (--no-archive): push it with "
                f"`{builts[0].engine.name} manifest push --all {lst.ref} docker://...`"
            )
        else:
            for path in describe_list(lst, builts, releases[0], args.signer):
                print(path)
    return builts


def check_image_args(args: argparse.Namespace, arches: list[str]) -> None:
    """Before any download: this host can build each arch's image, and with
    more than one, the engine can join them in a manifest list."""
    for arch in arches:
        check_platform(arch)
    tag = args.tag or ""
    if image_arch(Path(f"{image_name(tag)}.tar")):
        raise Fail(
            f"--tag {tag}: a name ending in -<arch> is taken for one arch's image "
            "(<tag>-x86_64, <tag>-aarch64); give one without it"
        )
    if len(arches) > 1:
        args.engine = list_engine(args.engine).name


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tpfix.image", description=__doc__.splitlines()[0])
    ap.add_argument("--line", choices=line_names(), help="release line (default: VERSION's)")
    ap.add_argument("--dist", type=Path, help="default dist/ (dist/TAG/ for another line)")
    add_image_args(ap)
    add_sign_arg(ap)
    ap.add_argument(
        "--arch",
        choices=[*wheel_arches(), "all"],
        help="the wheel of dist/ (default: its only one); all: an image of each "
        "arch's wheel and a manifest list over them",
    )
    ap.add_argument("--measure", action="store_true", help="compare our layer with a reinstall")
    args = ap.parse_args()
    from tpfix.release.attest import signing_key

    args.signer = signing_key(args.sign_key)
    line = args.line = get_line(args.line)
    ctx = BuildContext.resolve(line)  # the one read of VERSION, series and pins
    args.dist = args.dist or line.dist
    arches = ctx.arches if args.arch == "all" else [args.arch]
    if args.measure and len(arches) > 1:
        raise Fail("--measure compares one image: give --arch x86_64 or --arch aarch64")
    check_image_args(args, [a for a in arches if a])  # no --arch: the wheel's, read below
    # The image is made from dist/'s wheel: no build may replace it meanwhile.
    with dist_lock(args.dist, "build the image from another folder: --dist DIR"):
        check_signer(args.dist, args.signer)  # its files go into a signed dist/
        clear_staging(args.dist)  # what a killed run left (we hold the lock)
        wheels = [find_wheel(args.dist, arch)[0] for arch in arches]  # before any download
        releases = [release_in(args.dist, ctx, wheel=wheel) for wheel in wheels]
        builts = image_from_args(args, releases)
    if args.measure:
        sizes = measure(builts[0], args.base or line.official_image)
        print(f"layers added to the base: {sizes.pop('layers added')}")
        for what, size in sizes.items():
            print(f"{what:>22}: {size / 1e6:10.2f} MB  ({size} bytes, uncompressed layer)")


if __name__ == "__main__":
    main_wrapper(main)
