# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The manifest list over one image per arch (./build.sh --arch all --image,
python -m tpfix.image --arch all): one name, `<tag>`, for the images
`<tag>-x86_64` and `<tag>-aarch64` that tpfix.image.image built, so that `docker
pull` of a pushed copy picks the host's arch.

build_list makes it in the engine's local storage (buildah or podman;
docker keeps lists only in a registry) and writes it as an OCI archive,
<dist>/image/<name>.oci.tar (image_engine.save_list, reproducible);
describe_list writes its provenance beside it (signed with a key) and adds
both to SHA256SUMS.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tpfix.core.context import Release
from tpfix.core.util import sha256_file
from tpfix.image.image_engine import PLATFORMS, Built, make_list, save_list
from tpfix.stages.package import IMAGE, add_image_files, image_name


def _step(msg: str) -> None:
    print(f"==> {msg}", file=sys.stderr, flush=True)


@dataclass
class BuiltList:
    ref: str  # the manifest list in local storage
    archive: Path | None  # its OCI archive
    index: dict | None  # the OCI image index in it, with its "digest"


def build_list(builts: list[Built], archive_dir: Path | None) -> BuiltList:
    """The manifest list `<tag>` over the images of one build (one per arch)
    in the engine's local storage, and with `archive_dir` its OCI archive
    there, `<name>.oci.tar`: what `docker pull` of a pushed copy picks from."""
    first = builts[0]
    eng, tag = first.engine, first.tag
    _step(f"image: manifest list {tag} over {', '.join(b.ref for b in builts)}")
    make_list(eng, tag, [b.ref for b in builts])
    if archive_dir is None:
        return BuiltList(tag, None, None)
    path = archive_dir / f"{image_name(tag)}.oci.tar"
    _step(f"image: write {path}")
    archive, index = save_list(eng, tag, path, first.epoch)
    return BuiltList(tag, archive, index)


def describe_list(lst: BuiltList, builts: list[Built], release: Release, signer=None) -> list[Path]:
    """The provenance of the manifest list's OCI archive in <dist>/image/
    (signed by `signer`), then SHA256SUMS with both added.  Subjects: the
    list by its OCI image index digest, and the archive.  Resolved
    dependencies: each arch's image by its manifest digest in the list (with
    its platform) and the provenance that describes it (its config digest)."""
    from tpfix.release import attest

    dist, folder = builts[0].dist, Path(IMAGE)
    by_platform = {PLATFORMS[b.arch]: b for b in builts}
    deps = []
    for entry in lst.index["manifests"]:
        plat = f"{entry['platform']['os']}/{entry['platform']['architecture']}"
        b = by_platform[plat]
        deps.append(attest.resource_descriptor(b.ref, entry["digest"], platform=plat))
        deps.append(attest.file_dep(dist / folder / f"{image_name(b.tag, b.arch)}.provenance.json"))
    external = {
        "command": attest.build_command(),
        "line": release.line.tag,
        "platforms": sorted(by_platform),
        "version": release.version,
    }
    subjects = [(lst.ref, lst.index["digest"]), (lst.archive.name, sha256_file(lst.archive))]
    stmt = attest.statement("image-list", subjects, external, deps, builts[0].epoch)
    statement = folder / f"{image_name(lst.ref)}.provenance.json"
    texts = {statement: attest.dumps(stmt)}
    return add_image_files(dist, texts, statement, lst.archive, signer=signer)
