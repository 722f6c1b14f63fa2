# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A local stand-in for vllm/vllm-openai:v0.27.1 (and v0.33.0), built without any registry.

The real base cannot be pulled here.  The stand-in keeps what the image build
touches: a Debian rootfs (mmdebstrap) whose system python3 + pip install into
/usr/local/lib/python3.X/dist-packages like the official Ubuntu image, the
OFFICIAL vllm 0.27.1 wheel and flashinfer-python 0.6.16.post3 installed with
--no-deps (as uv does in the official image: no bytecode), the official image's
WORKDIR, an ENV and its ENTRYPOINT ["vllm", "serve"] (docker/Dockerfile, stage
vllm-openai).  flashinfer-cubin / flashinfer-jit-cache come from FlashInfer's
own index in the official image; here they are small fakes with the same
names and versions (what the version checks read), and `fake_index` serves
their 0.6.16.post4 builds the way that index does.

One per arch (`arch`): the aarch64 one is the official aarch64 wheel on an
arm64 rootfs, installed under the host's qemu emulator; `standin_list`
joins them under one name, as the official image's tag does.

Everything is cached by content: the rootfs under <cache>/images/, the image
in the engine's local storage as localhost/vllm-standin-base:<key>.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest

from tpfix.core.lines import TAG, get_line
from tpfix.core.util import cache_dir, cache_lock, host_arch
from tpfix.replay.harness import pinned_flashinfer
from tpfix.stages.fetch import fetch_test_dep, fetch_wheel
from tpfix.stages.patch import cached_tree

SUITE = "bookworm"
# Unpacked, not installed (mmdebstrap's `extract` variant: no maintainer
# script runs, so another arch needs no emulator for it and it takes seconds):
# python3 and pip with what they need, a shell for RUN, merged /usr like Ubuntu,
# and a CA bundle where the official image has one (the host's: the image
# build mounts it there, which must not add the path to our layer).
PACKAGES = ["python3", "python3-pip", "dash", "coreutils", "base-files"]
CA = "/etc/ssl/certs/ca-certificates.crt"
MMDEBSTRAP = [
    "--variant=extract",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    f'--extract-hook=mkdir -p "$1{Path(CA).parent}" && cp {CA} "$1{CA}"',
]
FI_OLD, FI_NEW = "0.6.16.post3", "0.6.16.post4"
CUDA = "cu130"
# Built reproducibly, like our image (fixed timestamps, no io.buildah.version
# label): what test_image.py finds in our image's config is then ours or the
# base's, never the stand-in builder's.
EPOCH = 1577836800  # 2020-01-01, the fake wheels' date
BUD_FLAGS = ["--timestamp", str(EPOCH), "--identity-label=false"]

CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
RUN --mount=type=bind,source=.,target=/ctx \\
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && \\
    python3 -m pip install --no-deps --no-index --no-compile \\
        --disable-pip-version-check --root-user-action=ignore /ctx/*.whl
ENV VLLM_USAGE_SOURCE=production-docker-image
WORKDIR /vllm-workspace
LABEL org.opencontainers.image.version=stand-in
ENTRYPOINT ["vllm", "serve"]
"""


def _need(tool: str, package: str) -> str:
    exe = shutil.which(tool)
    if not exe:
        pytest.fail(f"`{tool}` not found: install it (Debian: apt-get install {package})")
    return exe


def _storage_works(exe: str) -> bool:
    proc = subprocess.run([exe, "from", "scratch"], text=True, capture_output=True)
    if proc.returncode != 0:
        return False
    ctr = proc.stdout.strip()
    ok = subprocess.run([exe, "mount", ctr], capture_output=True).returncode == 0
    subprocess.run([exe, "rm", ctr], capture_output=True)
    return ok


def buildah_exe() -> str:
    """buildah, with a storage that works here (and mmdebstrap for the rootfs)."""
    _need("mmdebstrap", "mmdebstrap")
    exe = _need("buildah", "buildah")
    if not _storage_works(exe):
        # No overlay mounts here (e.g. nested in a container): vfs, slower, in
        # its own graph root so that it does not clash with the overlay store.
        conf = cache_dir() / "images" / "storage-vfs.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(
            '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage-vfs"\n'
            'graphroot = "/var/lib/containers/storage-vfs"\n'
        )
        os.environ["CONTAINERS_STORAGE_CONF"] = str(conf)
        assert _storage_works(exe), "buildah can use neither overlay nor vfs storage"
    return exe


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Debian's name of each arch (mmdebstrap --arch)
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def rootfs(arch: str | None = None) -> Path:
    """A Debian rootfs with python3 + pip as a tar for `arch` (default: the
    host's; mmdebstrap, seconds, cached)."""
    arch = arch or host_arch()
    key = _sha(f"{SUITE} {' '.join(MMDEBSTRAP + PACKAGES)} {arch}".encode())[:16]
    dest = cache_dir() / "images" / f"rootfs-{SUITE}-{key}.tar"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp{os.getpid()}-{dest.name}"  # mmdebstrap: .tar -> a tarball
    proc = subprocess.run(
        [
            "mmdebstrap",
            f"--arch={DEBIAN_ARCH[arch]}",
            *MMDEBSTRAP,
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(tmp),
        ],
        text=True,
        capture_output=True,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"mmdebstrap failed:\n{proc.stderr[-3000:]}")
    os.replace(tmp, dest)
    return dest


def fake_wheel(project: str, version: str, dest: Path) -> Path:
    """A tiny, deterministic wheel named and versioned like FlashInfer's package."""
    mod = project.replace("-", "_")
    dist_info = f"{mod}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": f'__version__ = "{version}"  # stand-in\n'.encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
            "Summary: test stand-in (the real one is on FlashInfer's index)\n"
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


def fake_index(root: Path) -> Path:
    """PEP 503 pages like FlashInfer's index: cubin at the root, jit-cache under /cuXXX."""
    for sub, project, version in [
        ("", "flashinfer-cubin", FI_NEW),
        (CUDA, "flashinfer-jit-cache", f"{FI_NEW}+{CUDA}"),
    ]:
        folder = root / sub / project if sub else root / project
        whl = fake_wheel(project, version, folder)
        sha = hashlib.sha256(whl.read_bytes()).hexdigest()
        (folder / "index.html").write_text(
            f'<html><body><a href="{whl.name}#sha256={sha}">{whl.name}</a></body></html>\n'
        )
    return root


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _inputs(ctx: Path, tag: str | None, arch: str) -> list[Path]:
    if tag is not None and tag != TAG:
        # vllm/vllm-openai of the newer lines (v0.33.0): the image fetches
        # FlashInfer's kernels with `flashinfer download-kernels` (its
        # docker/Dockerfile) instead of installing flashinfer-cubin /
        # flashinfer-jit-cache, so the stand-in holds flashinfer-python only,
        # at the release the tag's requirements/cuda.txt pins.
        line = get_line(tag)
        pristine = cached_tree(line, "")
        fi = fetch_test_dep("flashinfer-python", pinned_flashinfer(pristine))
        return [fetch_wheel(arch, tag), fi]
    official = fetch_wheel(arch, get_line().tag)
    fi = fetch_test_dep("flashinfer-python", FI_OLD)
    made = [
        fake_wheel("flashinfer-cubin", FI_OLD, ctx),
        fake_wheel("flashinfer-jit-cache", f"{FI_OLD}+{CUDA}", ctx),
    ]
    return [official, fi, *made]


def standin_base(buildah: str = "buildah", tag: str | None = None, arch: str | None = None) -> str:
    """localhost/vllm-standin-base:<content key>, built once; `tag`: another
    line's; `arch`: another arch's (linux/arm64 for aarch64: the official
    aarch64 wheel on an arm64 rootfs, built under the host's emulator)."""
    arch = arch or host_arch()
    # One build of each stand-in, whichever xdist worker asks first: test_image
    # and test_image_arches need the same one, each on its own worker.
    with cache_lock(f"standin-{tag or TAG}-{arch}"):
        return _standin_base(buildah, tag, arch)


def _standin_base(buildah: str, tag: str | None, arch: str) -> str:
    fs = rootfs(arch)
    with tempfile.TemporaryDirectory(dir=cache_dir() / "images") as tmp:
        ctx = Path(tmp)
        inputs = _inputs(ctx, tag, arch)
        key = hashlib.sha256(CONTAINERFILE.encode() + fs.name.encode())
        key.update(" ".join(BUD_FLAGS).encode() + arch.encode())
        for p in sorted(inputs, key=lambda p: p.name):
            key.update(p.name.encode() + hashlib.sha256(p.read_bytes()).digest())
        ref = f"localhost/vllm-standin-base:{key.hexdigest()[:16]}"
        if (
            subprocess.run(
                [buildah, "inspect", "--type", "image", ref], capture_output=True
            ).returncode
            == 0
        ):
            return ref
        for p in inputs:
            if p.parent != ctx:
                _link(p, ctx / p.name)
        _link(fs, ctx / "rootfs.tar")
        (ctx / "Containerfile").write_text(CONTAINERFILE)
        platform = [] if arch == host_arch() else ["--platform", f"linux/{DEBIAN_ARCH[arch]}"]
        proc = subprocess.run(
            [buildah, "bud", "--isolation", "chroot", *BUD_FLAGS, *platform, "-t", ref, str(ctx)],
            text=True,
            capture_output=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"stand-in base build failed:\n{proc.stdout[-3000:]}{proc.stderr}")
    return ref


def standin_list(buildah: str, arches: list[str], tag: str | None = None) -> str:
    """One name for the stand-ins of `arches`, as vllm/vllm-openai:<tag> is
    one name for both platforms: a manifest list in local storage over
    standin_base(..., arch) each, localhost/vllm-standin-base:list-<key>."""
    refs = [standin_base(buildah, tag, arch) for arch in arches]
    key = _sha(" ".join(refs).encode())[:16]
    ref = f"localhost/vllm-standin-base:list-{key}"
    with cache_lock(f"standin-list-{key}"):
        if subprocess.run([buildah, "manifest", "exists", ref], capture_output=True).returncode:
            for cmd in (["create", ref], *(["add", ref, r] for r in refs)):
                subprocess.run([buildah, "manifest", *cmd], capture_output=True, check=True)
    return ref
