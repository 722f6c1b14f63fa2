# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The container image (Dockerfile, scripts/tpfix/image/image.py), built here without a registry.

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

import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import standin_image
from packageurl import PackageURL
from served import Served
from small_dist import sums_dist

from tpfix.core.context import BuildContext
from tpfix.core.lines import TAG, get_line, image_tag
from tpfix.core.patch_format import read_series
from tpfix.core.util import ROOT, Fail, host_arch
from tpfix.image import image, image_engine
from tpfix.release import sbom
from tpfix.replay.harness import tree_after
from tpfix.stages.fetch import fetch_wheel
from tpfix.stages.package import image_name
from tpfix.stages.verify import touched_files

# builds a Debian rootfs, a stand-in base image and our image (buildah)
pytestmark = pytest.mark.slow

SITE_GLOB = "usr/local/lib/python3*/dist-packages"
CTX = BuildContext.resolve(get_line())


@pytest.fixture(scope="module")
def buildah() -> str:
    return standin_image.buildah_exe()


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
    with Served(root) as server:
        yield f"{server.url}/"


def _build(dist: Path, base: str, fi_index: str, ref: str, tmp: Path) -> image_engine.Built:
    """The image of dist/'s wheel on `base`, named `ref`, as ./build.sh --image
    builds it (its context and archive in `tmp`)."""
    return image.build_image(
        image.release_in(dist, CTX),
        base=base,
        tag=ref,
        flashinfer_index=fi_index,
        archive_dir=tmp / "out",
        engine="buildah",
        ctx=tmp / "ctx",
    )


@pytest.fixture(scope="module")
def built(buildah, dist, base, fi_index, tmp_path_factory) -> image_engine.Built:
    ref = f"localhost/vllm-tpfix-test:{image_tag(get_line().version).split(':')[1]}"
    b = _build(dist, base, fi_index, ref, tmp_path_factory.mktemp("image"))
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


def test_build_ran_the_in_build_checks(built):
    out = built.output
    version = get_line().version
    assert f"image: ok, vllm {version}" in out
    assert re.search(r"image: \d+ files of vllm-\S+\.whl verified against its RECORD", out)
    assert "image: pip check: no new problems" in out
    assert "matches SHA256SUMS" in out


def test_installed_vllm_is_ours(rootfs):
    site = _site(rootfs)
    version = get_line().version
    infos = sorted(p.name for p in site.glob("vllm-*.dist-info"))
    assert infos == [f"vllm-{version}.dist-info"]
    meta = (site / infos[0] / "METADATA").read_text()
    assert f"\nVersion: {version}\n" in meta
    scope: dict = {}
    exec((site / "vllm" / "_version.py").read_text(), scope)
    assert scope["__version__"] == version


def test_patched_files_match_tree_and_the_rest_is_official(rootfs):
    site = _site(rootfs)
    tree = tree_after(read_series(get_line().series)[-1])
    patched = {f for f in touched_files(get_line()) if f.startswith("vllm/")}
    assert patched, "the series touches no file under vllm/"
    for rel in patched:
        assert (site / rel).read_bytes() == (tree / rel).read_bytes(), rel
    checked = 0
    with zipfile.ZipFile(fetch_wheel(host_arch(), get_line().tag)) as z:
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
    ours = image_engine.inspect(image_engine.Engine("buildah", buildah), built.ref)["config"]
    theirs = image_engine.inspect(image_engine.Engine("buildah", buildah), base)["config"]
    for key in ("Entrypoint", "Cmd", "Env", "WorkingDir", "User", "StopSignal", "ExposedPorts"):
        assert ours.get(key) == theirs.get(key), key
    assert ours["Entrypoint"] == ["vllm", "serve"]
    labels = ours["Labels"]
    names, series_sha = image.series_info(CTX)
    wheel, digest = image.find_wheel(built.dist)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True, capture_output=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.version"] == get_line().version
    assert labels["org.opencontainers.image.revision"].startswith(head)
    assert labels["org.opencontainers.image.base.name"] == base
    assert labels["tpfix.upstream.tag"] == TAG
    assert labels["tpfix.series"] == " ".join(read_series(get_line().series)) == " ".join(names)
    assert labels["tpfix.series.sha256"] == series_sha
    assert labels["tpfix.wheel.sha256"] == digest
    for key, value in theirs["Labels"].items():  # the base's own labels stay
        if not key.startswith("org.opencontainers.image.") and key != "io.buildah.version":
            assert labels.get(key) == value, key


def test_one_small_layer_holding_only_the_difference(buildah, built, base):
    eng = image_engine.Engine("buildah", buildah)
    ours, theirs = (
        image_engine.inspect(eng, built.ref)["layers"],
        image_engine.inspect(eng, base)["layers"],
    )
    assert ours[:-1] == theirs, "the base's layers must be reused as they are"
    assert ours[-1] < 5_000_000, f"added layer is {ours[-1]} bytes"
    # The layer itself, from the docker-archive (which must be loadable).
    with tarfile.open(built.archive) as arc:
        manifest = json.load(arc.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == [built.ref], manifest
        with tarfile.open(fileobj=arc.extractfile(manifest[0]["Layers"][-1])) as layer:
            names = [m.name for m in layer.getmembers() if not m.isdir()]
    version = get_line().version
    patched = {f for f in touched_files(get_line()) if f.startswith("vllm/")} | {"vllm/_version.py"}
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


# --- failures ------------------------------------------------------------------


def _ctx_copy(built_ctx: Path, dest: Path) -> Path:
    shutil.copytree(built_ctx, dest, copy_function=lambda s, d: Path(d).hardlink_to(s))
    return dest


def _fail_build(buildah, base, ctx: Path, fi_index: str = "") -> str:
    eng = image_engine.Engine("buildah", buildah)
    args = {
        "BASE_IMAGE": base,
        "VERSION": get_line().version,
        "FLASHINFER_INDEX_URL": fi_index,
    }
    cmd = image_engine.build_cmd(eng, image.DOCKERFILE, ctx, "localhost/vllm-tpfix-test:fail", args)
    with pytest.raises(Fail) as e:
        image_engine.run_build(eng, cmd)
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
    assert ("flashinfer-python", "0.6.16.post4") in image.repins(
        wheel, fetch_wheel(host_arch(), get_line().tag)
    )


def test_context_holds_only_what_the_image_needs(dist, tmp_path):
    """From a dist/ whose SHA256SUMS lists SBOM, provenance and index files too,
    the build context gets the wheel and its SHA256SUMS line only."""
    wheel, digest = image.find_wheel(dist)
    full = sums_dist(tmp_path / "dist", wheel.name, b"")
    (full / wheel.name).unlink()
    (full / wheel.name).hardlink_to(wheel)
    sums = (full / "SHA256SUMS").read_text().replace(hashlib.sha256(b"").hexdigest(), digest, 1)
    (full / "SHA256SUMS").write_text(sums)
    ctx = tmp_path / "ctx"
    image.stage_context(image.release_in(full, CTX), ctx)
    staged = sorted(str(p.relative_to(ctx)) for p in ctx.rglob("*") if p.is_file())
    repinned = sorted(str(p.relative_to(ctx)) for p in (ctx / "wheels").glob("*.whl"))
    assert repinned and all(p.startswith("wheels/flashinfer_python-") for p in repinned)
    assert staged == sorted(
        [f"dist/{wheel.name}", "dist/SHA256SUMS", "image_inside.py", "wheels/SHA256SUMS"] + repinned
    )
    assert (ctx / "dist" / "SHA256SUMS").read_text() == f"{digest}  {wheel.name}\n"


# --- reproducible builds and the inventory ---------------------------------------------


def _digests(buildah: str, ref: str) -> dict:
    """What the reproducibility test compares, straight from local storage."""
    d = json.loads(
        subprocess.run(
            [buildah, "inspect", "--type", "image", ref], text=True, capture_output=True, check=True
        ).stdout
    )
    manifest = json.loads(d["Manifest"])
    return {
        "manifest layers": [x["digest"] for x in manifest["layers"]],
        "config diff_ids": d["OCIv1"]["rootfs"]["diff_ids"],
        "config digest": manifest["config"]["digest"],
        "config": d["OCIv1"],
    }


def _archive_members(path: Path) -> list[tuple]:
    """Every member of a docker-archive in order: its tar header (name, type,
    mode, owner, mtime, size) and content digest; manifest.json without its
    RepoTags and `repositories` without the names (each archive carries its
    own name: their sizes are left out too)."""
    out = []
    with tarfile.open(path) as arc:
        for m in arc.getmembers():
            head = (m.name, m.type, m.mode, m.uid, m.gid, m.uname, m.gname, m.mtime)
            if not m.isfile():
                out.append((*head, m.linkname))
                continue
            data = arc.extractfile(m)
            if m.name in ("manifest.json", "repositories"):
                doc = json.load(data)
                if m.name == "manifest.json":
                    for entry in doc:
                        entry.pop("RepoTags", None)
                else:  # {name: {tag: layer id}}
                    doc = sorted(i for tags in doc.values() for i in tags.values())
                out.append((*head, json.dumps(doc, sort_keys=True)))
                continue
            h = hashlib.sha256()
            for block in iter(lambda d=data: d.read(1 << 20), b""):
                h.update(block)
            out.append((*head, m.size, h.hexdigest()))
    return out


def test_rebuild_is_reproducible(buildah, dist, base, fi_index, built, tmp_path):
    """A second build of this commit from the same dist/, in another build
    context and under another name, gives the session's image again: the same
    top-layer digest (manifest layer digests and config rootfs.diff_ids, every
    layer), the same image config digest, and a docker-archive of the same
    bytes but for the name it carries.

    The session's image stays in local storage meanwhile: buildah bud without
    --layers builds every step again and reuses no cached layer (its output
    says `Using cache` where it would), so equal digests can only come from
    equal bytes.  Every timestamp is SOURCE_DATE_EPOCH (the sdist's, as the
    session's); nothing names the build host or buildah."""
    ref = "localhost/vllm-tpfix-test:reproducible"
    subprocess.run([buildah, "rmi", ref], capture_output=True)  # a killed run's
    try:
        b = _build(dist, base, fi_index, ref, tmp_path)
        assert "Using cache" not in b.output
        eng = image_engine.Engine("buildah", buildah)
        cmd = image_engine.build_cmd(eng, image.DOCKERFILE, b.ctx, ref, {}, b.epoch, b.arch)
        assert not [a for a in cmd if a.startswith("--layers")]
        assert os.environ.get("BUILDAH_LAYERS", "false") == "false"
        assert b.epoch == built.epoch and b.ctx != built.ctx and b.ref != built.ref
        first, second = _digests(buildah, built.ref), _digests(buildah, ref)
        for key in ("manifest layers", "config diff_ids", "config digest"):
            assert first[key] == second[key], key
        assert first["manifest layers"] == first["config diff_ids"]  # uncompressed, in storage
        assert _archive_members(b.archive) == _archive_members(built.archive)
        # Every timestamp is the epoch; nothing names the build host or buildah.
        config = second["config"]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(b.epoch))
        assert config["created"] == stamp
        ours = config["history"][len(_digests(buildah, base)["config"]["history"]) :]
        assert ours and all(h["created"] == stamp for h in ours), ours
        assert "io.buildah.version" not in (config["config"].get("Labels") or {})
        text = json.dumps(config)
        host = socket.gethostname()
        assert len(host) < 4 or host not in text, host
        with tarfile.open(b.archive) as arc:
            manifest = json.load(arc.extractfile("manifest.json"))
            with tarfile.open(fileobj=arc.extractfile(manifest[0]["Layers"][-1])) as layer:
                mtimes = {m.name: m.mtime for m in layer.getmembers()}
        assert mtimes and set(mtimes.values()) == {b.epoch}, mtimes
    finally:
        subprocess.run([buildah, "rmi", ref], capture_output=True)


def _containers_of(buildah: str, *refs: str) -> list[str]:
    """The working containers of the images `refs` (those image_inventory
    makes; another worker's image builds make and remove their own meanwhile)."""
    ids = {
        subprocess.run(
            [buildah, "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        for ref in refs
    }
    listed = subprocess.run(
        [buildah, "containers", "--notruncate", "--format", "{{.ContainerID}} {{.ImageID}}"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    return sorted(f[0] for f in map(str.split, listed.splitlines()) if f[1:2] and f[1] in ids)


def test_image_inventory(buildah, built, base):
    """image_inventory reads the built image itself: vllm at our VERSION, the
    stand-in's FlashInfer packages (at the version the series pins; the base's
    own inventory has the old one), the base's name and digest, real digests."""
    eng = image_engine.Engine("buildah", buildah)
    containers = _containers_of(buildah, built.ref, base)
    inv = image_engine.image_inventory(eng, built.ref, base)
    sha = re.compile(r"^sha256:[0-9a-f]{64}$")
    assert inv["base"]["name"] == base
    assert sha.match(inv["base"]["digest"]), inv["base"]
    annotations = json.loads(
        subprocess.run(
            [buildah, "inspect", "--type", "image", built.ref], text=True, capture_output=True
        ).stdout
    )["ImageAnnotations"]
    assert inv["base"]["digest"] == annotations["org.opencontainers.image.base.digest"]
    assert inv["image"]["ref"] == built.ref
    assert sha.match(inv["image"]["config_digest"]), inv["image"]
    assert inv["image"]["layers"] and all(sha.match(x) for x in inv["image"]["layers"])
    assert inv["image"]["config_digest"] == _digests(buildah, built.ref)["config digest"]
    dists = {p["name"]: p for p in inv["python"]}
    assert dists["vllm"]["version"] == get_line().version
    assert re.match(r"^/usr/local/lib/python3\.\d+/dist-packages$", dists["vllm"]["location"])
    new, old = standin_image.FI_NEW, standin_image.FI_OLD
    fi = {n: p["version"] for n, p in dists.items() if n.startswith("flashinfer")}
    assert fi == {
        "flashinfer-python": new,
        "flashinfer-cubin": new,
        "flashinfer-jit-cache": f"{new}+{standin_image.CUDA}",
    }
    assert "pip" in dists  # the base's own distributions too, not just ours
    # The base, inventoried the same way (its own base, scratch, has no digest).
    theirs = image_engine.image_inventory(eng, base, "scratch")
    assert theirs["base"] == {"name": "scratch", "digest": None}
    assert theirs["image"]["layers"] == inv["image"]["layers"][:-1]
    assert theirs["image"]["config_digest"] != inv["image"]["config_digest"]
    before = {p["name"]: p["version"] for p in theirs["python"]}
    assert before["vllm"] == TAG.lstrip("v") and before["flashinfer-python"] == old
    assert before["flashinfer-cubin"] == old
    after = _containers_of(buildah, built.ref, base)
    assert after == containers, "image_inventory left a working container"


def test_image_sbom_and_provenance_describe_the_built_image(buildah, built, base, tmp_path):
    """image.describe_image (what `./build.sh --image` runs after the build):
    schema-valid SBOM of the image's real environment and base, a provenance
    statement about its config digest, both in SHA256SUMS (a copy of dist/)."""
    dist = tmp_path / "dist"
    shutil.copytree(built.dist, dist, copy_function=os.link)
    b = dataclasses.replace(built, dist=dist, archive=None)
    paths = image.describe_image(b, image.release_in(b.dist, CTX), base)
    inv = image_engine.image_inventory(built.engine, built.ref, base)
    name = image_name(built.ref, host_arch())  # one arch's: <name>-<arch>
    assert name.endswith(f"-{host_arch()}") and built.tag == built.ref
    assert sorted(p.relative_to(dist).as_posix() for p in paths) == [
        f"image/{name}.cdx.json",
        f"image/{name}.provenance.json",
    ]
    text = (dist / "image" / f"{name}.cdx.json").read_text()
    sbom.validate(text)
    doc = json.loads(text)
    root = doc["metadata"]["component"]
    assert root["type"] == "container"
    assert root["hashes"][0]["content"] == inv["image"]["config_digest"].removeprefix("sha256:")
    platform = image_engine.PLATFORMS[host_arch()]  # the wheel's arch, given to the engine
    assert {"name": "tpfix:platform", "value": platform} in root["properties"]
    comps = {c["bom-ref"]: c for c in doc["components"]}
    (base_c,) = [c for c in comps.values() if c["type"] == "container"]
    repo, tag = base.rsplit(":", 1)  # localhost/vllm-standin-base:<key>
    assert (base_c["name"], base_c["version"]) == (repo, tag)
    assert base_c["hashes"][0]["content"] == inv["base"]["digest"].removeprefix("sha256:")
    purl = PackageURL.from_string(base_c["purl"])
    assert (purl.type, purl.name, purl.version) == (
        "oci",
        repo.rsplit("/", 1)[1],
        inv["base"]["digest"],
    )
    assert purl.qualifiers == {"repository_url": repo, "tag": tag}
    libs = sorted((c["name"], c["version"]) for c in comps.values() if c["type"] == "library")
    assert libs == sorted((d["name"], d["version"]) for d in inv["python"])
    (ours,) = [c for c in comps.values() if c["name"] == "vllm"]
    wheel, digest = image.find_wheel(dist)
    assert ours["version"] == get_line().version and ours["hashes"][0]["content"] == digest
    assert len(ours["pedigree"]["patches"]) == len(read_series(get_line().series))
    from sbom_checks import minimum_elements  # NTIA's and CISA's minimum, on the real image's

    assert minimum_elements(doc, {ours["bom-ref"]}) == []
    stmt = json.loads((dist / "image" / f"{name}.provenance.json").read_text())
    assert stmt["subject"] == [
        {"name": built.ref, "digest": {"sha256": inv["image"]["config_digest"][7:]}}
    ]
    assert stmt["predicate"]["buildDefinition"]["externalParameters"]["platform"] == platform
    resolved = stmt["predicate"]["buildDefinition"]["resolvedDependencies"]
    deps = {d["name"]: d["digest"]["sha256"] for d in resolved}
    assert deps[base] == inv["base"]["digest"][7:] and deps[wheel.name] == digest
    sums = (dist / "SHA256SUMS").read_text()
    assert f"  image/{name}.cdx.json\n" in sums and f"  {wheel.name}\n" in sums
    proc = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=dist, capture_output=True
    )
    assert proc.returncode == 0, proc.stdout
