# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The image of every release line but the default (the default line's is
test_image.py's), built here without a registry: ./build.sh --line TAG's
wheel on that line's stand-in base (tests/standin_image.py: a Debian rootfs
with the official wheel of TAG installed --no-deps), with buildah (chroot
isolation), as ./build.sh --line TAG --image does.  Needs buildah and
mmdebstrap (.ci/run installs them)."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile

import pytest
import standin_image

from tpfix.core.context import BuildContext
from tpfix.core.lines import image_tag, read_version
from tpfix.core.patch_format import read_series
from tpfix.image import image, image_engine
from tpfix.stages.verify import touched_files

# builds each line's stand-in base and its image (buildah)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def buildah() -> str:
    return standin_image.buildah_exe()


@pytest.fixture(scope="module")
def line_image(buildah, line_build, tmp_path_factory):
    """The image of another line (./build.sh --line TAG's wheel) on its stand-in base."""
    line, wheel = line_build
    base = standin_image.standin_base(buildah, line.tag)
    version = read_version(line.version_file)
    ref = f"localhost/vllm-tpfix-test:{image_tag(version).split(':')[1]}"
    tmp = tmp_path_factory.mktemp("line-image")
    b = image.build_image(
        image.release_in(wheel.parent, BuildContext.resolve(line)),
        base=base,
        tag=ref,
        archive_dir=tmp / "out",
        engine="buildah",
        ctx=tmp / "ctx",
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
    eng = image_engine.Engine("buildah", buildah)
    ours, theirs = (
        image_engine.inspect(eng, built.ref)["layers"],
        image_engine.inspect(eng, base)["layers"],
    )
    assert ours[:-1] == theirs and ours[-1] < 5_000_000
    labels = image_engine.inspect(eng, built.ref)["config"].get("Labels") or {}
    names, digest = image.series_info(BuildContext.resolve(line))
    assert labels["tpfix.upstream.tag"] == line.tag
    assert labels["org.opencontainers.image.version"] == version
    assert labels["tpfix.series"] == " ".join(names) and names
    assert labels["tpfix.series.sha256"] == digest
    with tarfile.open(built.archive) as arc:
        manifest = json.load(arc.extractfile("manifest.json"))
        with tarfile.open(fileobj=arc.extractfile(manifest[0]["Layers"][-1])) as layer:
            names = [m.name for m in layer.getmembers() if not m.isdir()]
    names_of_line = read_series(line.series)
    patched = {f for f in touched_files(line, names_of_line) if f.startswith("vllm/")}
    allowed = re.compile(
        r"^usr/local/lib/python3[^/]*/dist-packages/("
        + "|".join(re.escape(p) for p in sorted(patched | {"vllm/_version.py"}))
        + rf"|vllm-{re.escape(version)}\.dist-info/.*"
        + rf"|\.wh\.vllm-{re.escape(public)}\.dist-info)$|^usr/local/bin/vllm$"
    )
    strays = [n for n in names if not allowed.match(n)]
    assert not strays, strays
    assert all(any(n.endswith("/" + p) for n in names) for p in patched), names
