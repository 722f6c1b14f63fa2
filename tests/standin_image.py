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

from tpfix.fetch import fetch_test_dep, fetch_wheel
from tpfix.lines import TAG, get_line
from tpfix.patch import cached_tree
from tpfix.replay.harness import pinned_flashinfer
from tpfix.util import cache_dir, host_arch

SUITE = "bookworm"
PACKAGES = ["python3", "python3-pip"]
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


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rootfs() -> Path:
    """Debian minbase + python3 + pip as a tar (mmdebstrap, ~30 s, cached)."""
    key = _sha(f"{SUITE} {' '.join(PACKAGES)} {host_arch()}".encode())[:16]
    dest = cache_dir() / "images" / f"rootfs-{SUITE}-{key}.tar"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp{os.getpid()}-{dest.name}"  # mmdebstrap: .tar -> a tarball
    proc = subprocess.run(
        ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp)],
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


def _inputs(ctx: Path, tag: str | None = None) -> list[Path]:
    if tag is not None and tag != TAG:
        # vllm/vllm-openai of the newer lines (v0.33.0): the image fetches
        # FlashInfer's kernels with `flashinfer download-kernels` (its
        # docker/Dockerfile) instead of installing flashinfer-cubin /
        # flashinfer-jit-cache, so the stand-in holds flashinfer-python only,
        # at the release the tag's requirements/cuda.txt pins.
        line = get_line(tag)
        pristine = cached_tree(line, "")
        fi = fetch_test_dep("flashinfer-python", pinned_flashinfer(pristine))
        return [fetch_wheel(host_arch(), tag), fi]
    official = fetch_wheel(host_arch(), get_line().tag)
    fi = fetch_test_dep("flashinfer-python", FI_OLD)
    made = [
        fake_wheel("flashinfer-cubin", FI_OLD, ctx),
        fake_wheel("flashinfer-jit-cache", f"{FI_OLD}+{CUDA}", ctx),
    ]
    return [official, fi, *made]


def standin_base(buildah: str = "buildah", tag: str | None = None) -> str:
    """localhost/vllm-standin-base:<content key>, built once; `tag`: another line's."""
    fs = rootfs()
    with tempfile.TemporaryDirectory(dir=cache_dir() / "images") as tmp:
        ctx = Path(tmp)
        inputs = _inputs(ctx, tag)
        key = hashlib.sha256(CONTAINERFILE.encode() + fs.name.encode())
        key.update(" ".join(BUD_FLAGS).encode())
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
        proc = subprocess.run(
            [buildah, "bud", "--isolation", "chroot", *BUD_FLAGS, "-t", ref, str(ctx)],
            text=True,
            capture_output=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"stand-in base build failed:\n{proc.stdout[-3000:]}{proc.stderr}")
    return ref
