# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Both arches in one dist: `./build.sh --arch all --image`, run as a user
runs it, builds the x86_64 and the aarch64 wheel into one dist, an image of
each for its platform (linux/amd64, linux/arm64) and a manifest list over
the two, all of it signed.

What is real: build.sh, both wheels, buildah building each image from the
Dockerfile on this x86_64 host (the arm64 one runs the base's python3 under
the host's qemu emulator, qemu-user-static; .ci/run installs it), the
manifest list and its OCI archive, the signatures and both verifiers.  What
stands in: the base (the official multi-arch vllm/vllm-openai:v0.27.1 cannot
be pulled): tests/standin_image.py's stand-in for each arch, the official
wheel of that arch on a Debian rootfs of that arch, joined under one name by
a manifest list in local storage, as the official tag joins both platforms;
and FlashInfer's index (its fake, as in test_image.py).  What the image
holds beyond its arch is test_image.py's; the dist rules per arch on small
files are test_package.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import standin_image
from served import Served
from small_dist import check_sums, keypair, sums

from tpfix.core.lines import TAG, get_line, image_tag, wheel_arches
from tpfix.core.util import ROOT, Fail, host_arch, sha256_file
from tpfix.image import image, image_engine
from tpfix.stages.package import image_name

# builds both wheels, a stand-in base per arch and our two images (buildah)
pytestmark = pytest.mark.slow

ARCHES = wheel_arches(TAG)
ELF_MACHINE = {"x86_64": 0x3E, "aarch64": 0xB7}  # e_machine, at byte 18 of an ELF file
IMAGE_FILES = (".tar", ".cdx.json", ".provenance.json", ".intoto.jsonl")  # per arch
LIST_FILES = (".oci.tar", ".provenance.json", ".intoto.jsonl")
SITE_GLOB = "usr/local/lib/python3*/dist-packages"
ATTEST_VERIFY = [sys.executable, "-m", "tpfix.release.attest", "verify"]


@pytest.fixture(scope="module")
def buildah() -> str:
    exe = standin_image.buildah_exe()
    for arch in ARCHES:
        try:
            image_engine.check_platform(arch)
        except Fail as e:  # this host cannot run the other arch: the product's own error
            pytest.fail(f"{e}\n(.ci/run installs qemu-user-static and binfmt-support)")
    return exe


@pytest.fixture(scope="module")
def release(buildah, built_wheel, tmp_path_factory):
    """./build.sh --arch all --image into a fresh, signed dist.  After the
    run's own x86_64 build (built_wheel, which the run makes anyway): this
    build takes that wheel from the built-wheel cache, as it does when it runs
    later, instead of building it a second time, whichever worker runs first
    (conftest.COST hands this file out first)."""
    tmp = tmp_path_factory.mktemp("arches")
    priv, pub = keypair(tmp)
    base = standin_image.standin_list(buildah, ARCHES)
    tag = f"localhost/vllm-tpfix-arches:{image_tag(get_line().version).split(':')[1]}"
    dist = tmp / "dist"
    with Served(standin_image.fake_index(tmp / "flashinfer-index")) as fi:
        proc = subprocess.run(
            [str(ROOT / "build.sh"), "--arch", "all", "--image", "--engine", "buildah"]
            + ["--base", base, "--tag", tag, "--flashinfer-index", f"{fi.url}/"]
            + ["--dist", str(dist), "--workdir", str(tmp / "work"), "--sign-key", str(priv)],
            text=True,
            capture_output=True,
            timeout=1800,
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield {"dist": dist, "tag": tag, "base": base, "pub": pub, "out": proc.stdout}
    subprocess.run([buildah, "manifest", "rm", tag], capture_output=True)
    # and what `buildah from oci-archive:` stored under the list's name
    for ref in (tag, *(f"{tag}-{arch}" for arch in ARCHES)):
        subprocess.run([buildah, "rmi", ref], capture_output=True)


def _inspect(buildah: str, ref: str) -> dict:
    proc = subprocess.run(
        [buildah, "inspect", "--type", "image", ref], text=True, capture_output=True, check=True
    )
    return json.loads(proc.stdout)


def _config_digest(buildah: str, ref: str) -> str:
    return json.loads(_inspect(buildah, ref)["Manifest"])["config"]["digest"]


def test_one_dist_holds_both_wheels_both_images_and_the_list(release):
    dist, tag = release["dist"], release["tag"]
    name = image_name(tag)
    listed = set(sums(dist))
    for arch in ARCHES:
        wheel, _ = image.find_wheel(dist, arch)
        assert wheel.name in listed
        assert (
            f"../../{wheel.name}#sha256=" in (dist / "simple" / "vllm" / "index.html").read_text()
        )
        assert {f"image/{name}-{arch}{s}" for s in IMAGE_FILES} <= listed
    assert {f"image/{name}{s}" for s in LIST_FILES} <= listed
    on_disk = {p.relative_to(dist).as_posix() for p in (dist / "image").iterdir()}
    assert on_disk == {p for p in listed if p.startswith("image/")}  # nothing else, no leftovers
    check_sums(dist)


def test_every_published_file_verifies_with_both_verifiers(release):
    """verify.py --dist (every listed file under the signed SHA256SUMS), and
    each signed provenance against its artifact with verify.py and with
    `tpfix.release.attest verify`, which must agree."""
    dist, pub, name = release["dist"], str(release["pub"]), image_name(release["tag"])
    proc = subprocess.run(
        [sys.executable, str(dist / "verify.py"), "--dist", str(dist), "--key", pub],
        text=True,
        capture_output=True,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("OK: "), proc.stderr
    pairs = [(f"{name}-{a}.intoto.jsonl", f"{name}-{a}.tar") for a in ARCHES]
    pairs.append((f"{name}.intoto.jsonl", f"{name}.oci.tar"))
    for envelope, artifact in pairs:
        args = [str(dist / "image" / envelope), "--key", pub, "--artifact"]
        for cmd in ([sys.executable, str(dist / "verify.py")], ATTEST_VERIFY):
            ok = subprocess.run([*cmd, *args, str(dist / "image" / artifact)], capture_output=True)
            assert ok.returncode == 0, (cmd, envelope, ok.stderr)
            # not its subject: refused by both, the same way
            bad = subprocess.run(
                [*cmd, *args, str(dist / "SHA256SUMS")], text=True, capture_output=True
            )
            assert bad.returncode == 2 and bad.stderr.startswith("error: "), (cmd, bad.stderr)


def _elf_machine(buildah: str, ref: str) -> tuple[int, bytes]:
    """e_machine of vllm/cumem_allocator.abi3.so in image `ref`, and the file's bytes."""
    ctr = subprocess.run(
        [buildah, "from", "--pull-never", ref], text=True, capture_output=True, check=True
    ).stdout.strip()
    try:
        root = Path(
            subprocess.run(
                [buildah, "mount", ctr], text=True, capture_output=True, check=True
            ).stdout.strip()
        )
        (so,) = root.glob(f"{SITE_GLOB}/vllm/cumem_allocator.abi3.so")
        data = so.read_bytes()
    finally:
        subprocess.run([buildah, "rm", ctr], capture_output=True)
    return int.from_bytes(data[18:20], "little"), data


@pytest.mark.parametrize("arch", ARCHES)
def test_each_image_is_its_arch_on_its_arch_base(buildah, release, arch):
    """The image of each arch is for its platform, holds that arch's wheel's
    kernels (ELF machine and bytes), was built on that arch's stand-in out
    of the one multi-arch base name, and its SBOM and provenance say so."""
    dist, tag, base = release["dist"], release["tag"], release["base"]
    ref = f"{tag}-{arch}"
    d = _inspect(buildah, ref)
    platform = image_engine.PLATFORMS[arch]
    assert f"{d['OCIv1']['os']}/{d['OCIv1']['architecture']}" == platform
    machine, data = _elf_machine(buildah, ref)
    assert machine == ELF_MACHINE[arch]
    wheel, _ = image.find_wheel(dist, arch)
    with zipfile.ZipFile(wheel) as z:
        assert z.read("vllm/cumem_allocator.abi3.so") == data
    # built on this arch's stand-in, which the one base name resolved to
    own_base = standin_image.standin_base(buildah, None, arch)
    own_digest = _inspect(buildah, own_base)["FromImageDigest"]
    annotations = d["ImageAnnotations"]
    assert annotations["org.opencontainers.image.base.name"] == own_base
    assert annotations["org.opencontainers.image.base.digest"] == own_digest
    assert d["OCIv1"]["config"]["Labels"]["org.opencontainers.image.base.name"] == base
    name = image_name(tag, arch)
    bom = json.loads((dist / "image" / f"{name}.cdx.json").read_text())
    assert {"name": "tpfix:platform", "value": platform} in bom["metadata"]["component"][
        "properties"
    ]
    (base_c,) = [c for c in bom["components"] if c["type"] == "container"]
    assert base_c["hashes"][0]["content"] == own_digest.removeprefix("sha256:")
    stmt = json.loads((dist / "image" / f"{name}.provenance.json").read_text())
    assert stmt["predicate"]["buildDefinition"]["externalParameters"]["platform"] == platform
    resolved = stmt["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert {x["name"]: x["digest"]["sha256"] for x in resolved}[base] == own_digest[7:]
    assert stmt["subject"][0] == {
        "name": tag,
        "digest": {"sha256": _config_digest(buildah, ref).removeprefix("sha256:")},
    }
    # the docker-archive holds this arch's image as <tag> first (buildah adds
    # its local name): `docker load` on a host of that arch gives what
    # `docker run` names
    with tarfile.open(dist / "image" / f"{name}.tar") as arc:
        (entry,) = json.load(arc.extractfile("manifest.json"))
        config = json.load(arc.extractfile(entry["Config"]))
    assert entry["RepoTags"][0] == tag and set(entry["RepoTags"]) <= {tag, ref}
    assert config["architecture"] == d["OCIv1"]["architecture"]


def test_the_list_archive_is_written_deterministically(buildah, release, tmp_path):
    """The list written again from the same images: the same bytes (the
    engine's layout, tarred sorted, root-owned, at SOURCE_DATE_EPOCH).  With
    test_image.py's two builds giving the same image, two builds give the
    same list."""
    dist, tag = release["dist"], release["tag"]
    archive = dist / "image" / f"{image_name(tag)}.oci.tar"
    with tarfile.open(archive) as arc:
        epochs = {m.mtime for m in arc.getmembers()}
    (epoch,) = epochs
    eng = image_engine.Engine("buildah", buildah)
    again, index = image_engine.save_list(eng, tag, tmp_path / archive.name, epoch)
    # the published archive's digest (test_one_dist_holds_... checks the file has it)
    assert sha256_file(again) == sums(dist)[f"image/{archive.name}"]
    assert not [p for p in tmp_path.iterdir() if p != again]  # no layout left behind
    assert sorted(m["platform"]["architecture"] for m in index["manifests"]) == sorted(
        image_engine.PLATFORMS[a].split("/")[1] for a in ARCHES
    )


def test_the_list_picks_each_platform_and_the_host_by_default(buildah, release):
    """The manifest list's OCI archive: an index of both platforms; pulling
    from it (buildah from oci-archive:, as a registry copy is pulled) gives
    the host's image by default and each arch's when asked, the very images
    built; its provenance names the index digest and each image.  Last in
    this file: buildah stores what it pulls under the archive's name, which
    then no longer names the list in local storage."""
    dist, tag = release["dist"], release["tag"]
    archive = dist / "image" / f"{image_name(tag)}.oci.tar"
    with tarfile.open(archive) as arc:
        (top,) = json.load(arc.extractfile("index.json"))["manifests"]
        index = json.load(arc.extractfile("blobs/sha256/" + top["digest"].split(":", 1)[1]))
        assert {m.uid for m in arc.getmembers()} == {0}
    plats = {
        f"{m['platform']['os']}/{m['platform']['architecture']}": m for m in index["manifests"]
    }
    assert sorted(plats) == sorted(image_engine.PLATFORMS[a] for a in ARCHES)
    picked = {}
    for arch in [None, *ARCHES]:
        flags = ["--arch", image_engine.PLATFORMS[arch].split("/")[1]] if arch else []
        ctr = subprocess.run(
            [buildah, "from", *flags, f"oci-archive:{archive}"],
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        try:
            d = json.loads(
                subprocess.run(
                    [buildah, "inspect", "--type", "container", ctr],
                    text=True,
                    capture_output=True,
                    check=True,
                ).stdout
            )
        finally:
            subprocess.run([buildah, "rm", ctr], capture_output=True)
        picked[arch] = d["FromImageID"]
    for arch in ARCHES:
        assert "sha256:" + picked[arch] == _config_digest(buildah, f"{tag}-{arch}")
    assert picked[None] == picked[host_arch()]
    stmt = json.loads(archive.with_name(f"{image_name(tag)}.provenance.json").read_text())
    assert stmt["subject"][0] == {"name": tag, "digest": {"sha256": top["digest"][7:]}}
    deps = stmt["predicate"]["buildDefinition"]["resolvedDependencies"]
    for plat, entry in plats.items():
        (dep,) = [d for d in deps if d.get("annotations", {}).get("platform") == plat]
        assert dep["digest"]["sha256"] == entry["digest"][7:]
