# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The container engines the image is built with: docker (buildx where it
answers), buildah or podman (daemonless, --isolation chroot), one `Engine`.

Used by tpfix.image.image (the image build flow) and tpfix.pipeline (check_platform,
before any download): which engine is there (detect_engine), whether this
host can build for an arch (PLATFORMS, check_platform: the base image's
python3 runs in the build, so another arch needs its qemu binfmt entry), the
build command (build_cmd: reproducible with `epoch`: buildah / podman
`--timestamp N --identity-label=false`; docker `--build-arg
SOURCE_DATE_EPOCH=N`, and with buildx `--output type=docker,rewrite-timestamp=true`
in place of `--load`), running it (run_build: image_inside.py's error, not the
engine's noise), reading an image back (inspect), writing a docker-archive
(save_archive), a manifest list over one image per arch (make_list, and
save_list: an OCI archive of it, reproducible), and `image_inventory`: what
the built image holds (base digest, config and layer digests, every Python
distribution) for its SBOM (tpfix.image.image_sbom).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

from tpfix.core.util import PARTIAL, Fail, host_arch, run

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


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

    order = {"auto": ["docker", "buildah", "podman"], "daemonless": ["buildah", "podman"]}
    order = order.get(prefer, [prefer])
    for name in order:
        eng = docker() if name == "docker" else daemonless(name)
        if eng:
            return eng
    raise Fail(
        "no image builder: need a running docker engine, or buildah / podman "
        "(Debian: apt-get install buildah)"
        if prefer == "auto"
        else "no buildah or podman here, which a manifest list needs (Debian: apt-get "
        "install buildah)"
        if prefer == "daemonless"
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
            f"install qemu-user-static binfmt-support; in a container without {BINFMT} "
            f"mounted, first: mount -t binfmt_misc binfmt_misc {BINFMT}), or build the "
            f"image on an {arch} host"
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


def save_archive(eng: Engine, ref: str, out: Path, name: str | None = None) -> Path:
    """A docker-archive (`docker load -i` / `podman load -i`) of image `ref`,
    holding it as `name` (default `ref`), written atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}{PARTIAL}"  # a killed run's: package.clear_staging
    tmp.unlink(missing_ok=True)
    cmd = [eng.exe, "push", "--quiet", ref, f"docker-archive:{tmp}:{name or ref}"]
    try:
        proc = run(cmd)
        if proc.returncode != 0:
            raise Fail(f"could not write {out}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)  # interrupted or failed: no partial archive
    return out


@dataclass
class Built:
    """One arch's image as tpfix.image.image built it (build_image)."""

    ref: str  # in the engine's local storage
    engine: Engine
    archive: Path | None
    output: str
    seconds: float
    dist: Path
    ctx: Path
    epoch: int  # the SOURCE_DATE_EPOCH it was built with
    tag: str  # the image's name: its archive's (and the manifest list's, --arch all)
    arch: str


# --- the manifest list over one image per arch --------------------------------------


def list_engine(prefer: str = "auto") -> Engine:
    """The engine of a build that makes a manifest list (--arch all), checked
    before any work: buildah or podman (auto: either, even where docker
    answers), as the list is made in their local storage; docker keeps lists
    only in a registry."""
    eng = detect_engine("daemonless" if prefer == "auto" else prefer)
    if eng.name == "docker":
        raise Fail(
            "--arch all makes a manifest list, which needs buildah or podman "
            "(--engine buildah); with docker, build each arch (--arch x86_64, "
            "--arch aarch64), push both and join them where you push: "
            "docker buildx imagetools create -t NAME IMAGE-x86_64 IMAGE-aarch64"
        )
    return eng


def make_list(eng: Engine, ref: str, images: list[str]) -> None:
    """The manifest list `ref` in local storage over `images` (one per
    platform, each entry gets its image's platform), each taken from local
    storage (podman would look a bare name up in a registry first).  An image
    or list of an earlier build that holds the name gives it up first."""
    run([eng.exe, "manifest", "rm", ref])  # a list of that name: gone, or none
    run([eng.exe, "rmi", ref])  # an image of that name: untagged, or none
    adds = (["add", ref, f"containers-storage:{image}"] for image in images)
    for cmd in (["create", ref], *adds):
        proc = run([eng.exe, "manifest", *cmd])
        if proc.returncode != 0:
            raise Fail(f"{eng.name} manifest {' '.join(cmd)}: {proc.stderr.strip()[-2000:]}")


def save_list(eng: Engine, ref: str, out: Path, epoch: int) -> tuple[Path, dict]:
    """The manifest list `ref` with all its images as an OCI image layout in
    one tar (`skopeo copy --all oci-archive:OUT docker://...`, `podman load
    -i`), written atomically; returns it and the OCI image index it holds.
    Reproducible: the engine writes the layout (gzip layers, digests fixed by
    content), the tar holds its files sorted, owned by root, at `epoch`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # PARTIAL in its name: a killed run's is removed by the next (package.clear_staging)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}{PARTIAL}", dir=out.parent) as tmp:
        layout = Path(tmp) / "layout"
        proc = run(
            [eng.exe, "manifest", "push", "--all", "--format", "oci", "--quiet"]
            + [ref, f"oci:{layout}:{ref}"]
        )
        if proc.returncode != 0:
            raise Fail(f"could not write {out}: {proc.stderr.strip()[-2000:]}")
        top = json.loads((layout / "index.json").read_text())["manifests"][0]
        blob = layout / "blobs" / Path(*top["digest"].split(":", 1))
        index = {"digest": top["digest"], **json.loads(blob.read_text())}
        part = Path(tmp) / "archive.tar"
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(layout.rglob("*")):
                info = tar.gettarinfo(path, path.relative_to(layout).as_posix())
                info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
                info.mode = 0o755 if path.is_dir() else 0o644
                if path.is_file():
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        os.replace(part, out)
    return out, index


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

    {"base": {"name": base, "digest": "sha256:..." or None},  (the one built on)
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
    # The base the build resolved (buildah, podman record it): of a multi-arch
    # base name, the image of the built platform, not of the host's.
    annotations = d.get("ImageAnnotations") or d.get("Annotations") or {}  # buildah, podman
    resolved = annotations.get("org.opencontainers.image.base.digest")
    return {
        "base": {"name": base, "digest": resolved or _base_digest(eng, base)},
        "image": {"ref": ref, "config_digest": config_digest, "layers": list(layers)},
        "python": _python_dists(eng, ref),
    }
