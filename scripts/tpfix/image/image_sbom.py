# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The image's CycloneDX SBOM (`<image>.cdx.json`), written by tpfix.image.image
beside the image's provenance, from what tpfix.image.image_engine.image_inventory
reads in the built image: the image (config digest), the base image by name
and digest where local storage knows it, and every Python distribution
installed in the image, our vLLM with the wheel's pedigree.

What both SBOMs share (authors, no timestamp, the schema check): tpfix.release.sbom;
the wheel's component and its pedigree: tpfix.release.wheel_sbom.
"""

from __future__ import annotations

from cyclonedx.model import Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from tpfix.release.sbom import SUPPLIER_UNKNOWN, distribution, new_bom, sha256_hash


def split_ref(ref: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of an image reference (`host:port/name:tag@sha256:...`)."""
    ref, _, digest = ref.partition("@")
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        ref, tag = ref.rsplit(":", 1)
        return ref, tag, digest or None
    return ref, None, digest or None


def _oci_purl(ref: str, digest: str) -> PackageURL:
    repo, tag, _ = split_ref(ref)
    quals = {"repository_url": repo, **({"tag": tag} if tag else {})}
    return PackageURL("oci", name=repo.rsplit("/", 1)[-1].lower(), version=digest, qualifiers=quals)


def image_bom(
    inventory: dict,
    wheel: Component,
    epoch: str | int,
    version: str,
    tag: str,
    stem: str,
    platform: str | None = None,
) -> Bom:
    """The image's SBOM (<stem>.cdx.json) from tpfix.image.image_engine.image_inventory() and
    the wheel's component; `platform` (e.g. linux/arm64) as a property of the
    image.  The image itself is named by its config digest (the image ID):
    the manifest digest exists only once it is pushed."""
    img = inventory["image"]
    config = img["config_digest"].removeprefix("sha256:")
    root = Component(
        type=ComponentType.CONTAINER,
        name=split_ref(img["ref"])[0],
        version=version,
        bom_ref=f"image:{img['ref']}",
        supplier=distribution(),
        manufacturer=distribution(),
        hashes=[sha256_hash(config)],
        description=f"vLLM {tag} image with the tpfix wheel (config digest sha256:{config})",
        properties=[Property(name="tpfix:layer", value=d) for d in img["layers"]]
        + ([Property(name="tpfix:platform", value=platform)] if platform else []),
    )
    bom = new_bom(root, config, epoch, version)
    base = inventory["base"]
    digest = base.get("digest")
    base_c = Component(
        type=ComponentType.CONTAINER,
        name=split_ref(base["name"])[0],
        version=split_ref(base["name"])[1],
        bom_ref=f"base:{base['name']}",
        purl=_oci_purl(base["name"], digest) if digest else None,
        hashes=[sha256_hash(digest.removeprefix("sha256:"))] if digest else [],
        description="base image, by its manifest digest"
        if digest
        else "base image (its digest is not known to local storage)",
        properties=[Property(name="tpfix:supplier", value=SUPPLIER_UNKNOWN)],
    )
    deps = [base_c]
    seen = [(canonicalize_name(d["name"]), d["version"]) for d in inventory["python"]]
    for dist, key in zip(inventory["python"], seen, strict=True):
        if key == ("vllm", wheel.version):
            c = wheel
        else:
            ref = f"pkg:pypi/{key[0]}@{key[1]}"
            if seen.count(key) > 1:  # the same release in two places: both, by place
                ref += f"#{dist.get('location', '')}"
            c = Component(
                type=ComponentType.LIBRARY,
                name=dist["name"],
                version=dist["version"],
                purl=PackageURL("pypi", name=key[0], version=key[1]),
                bom_ref=ref,
                properties=[
                    Property(name="tpfix:location", value=dist.get("location", "")),
                    Property(name="tpfix:supplier", value=SUPPLIER_UNKNOWN),
                ],
            )
        deps.append(c)
    for c in deps:
        bom.components.add(c)
    bom.register_dependency(root, deps)
    return bom
