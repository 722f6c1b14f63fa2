# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""CycloneDX SBOMs of the wheel and of the image (cyclonedx-python-lib).

The wheel's SBOM (`<wheel>.cdx.json`, CycloneDX 1.6 JSON):
  * the root component is our wheel (purl pkg:pypi/vllm@<VERSION>, sha256);
  * its pedigree names the exact upstream inputs as ancestors (the pinned
    sdist and the official wheel, with their sha256) and each patch of the
    series as a patch entry: backport (applied upstream later) or
    unofficial, its diff attached, the bug it resolves with its upstream
    references (the patch header's Bug: and Related: fields);
  * the wheel's declared requirements (METADATA Requires-Dist) as
    components, the root depending on them; a `==` pin carries its version,
    a range only its requirement string (property tpfix:requirement).

The image's SBOM (`<image>.cdx.json`): the image (config digest), the base
image by name and digest where local storage knows it, and every Python
distribution installed in the image, our vLLM with the wheel's pedigree.

Both are reproducible: the serial number derives from the subject's
sha256, the timestamp from SOURCE_DATE_EPOCH, and the tools are pinned.
Each is validated against the CycloneDX schema before it is written.

    python -m tpfix.sbom validate FILE...     # schema-check SBOMs
"""

from __future__ import annotations

import argparse
import re
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from cyclonedx.contrib.this.builders import this_component
from cyclonedx.model import (
    AttachedText,
    ExternalReference,
    ExternalReferenceType,
    HashAlgorithm,
    HashType,
    Property,
    XsUri,
)
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import (
    Component,
    ComponentScope,
    ComponentType,
    Diff,
    Patch,
    PatchClassification,
    Pedigree,
)
from cyclonedx.model.issue import IssueClassification, IssueType
from cyclonedx.model.license import LicenseExpression
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from tpfix.common import Fail, Line, main_wrapper, sha256_file, wheel_message
from tpfix.patch_format import read_patch, read_series
from tpfix.triage import load_triage

SCHEMA = SchemaVersion.V1_6
_GITHUB = "https://github.com/"
_SHORT_REF = re.compile(r"\b([\w.-]+/)?([\w.-]+)?#(\d+)\b")
_URL = re.compile(r"https?://\S+[^\s).,;]")


def _sha256(hexdigest: str) -> HashType:
    return HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)


def _refs(text: str) -> list[str]:
    """The URLs in a header field: links as written, `vllm#123` and
    `owner/repo#123` as GitHub links (vLLM's own repository by default)."""
    urls = _URL.findall(text)
    for owner, repo, num in _SHORT_REF.findall(_URL.sub("", text)):
        if owner:
            urls.append(f"{_GITHUB}{owner}{repo}/issues/{num}")
        elif repo == "vllm":
            urls.append(f"{_GITHUB}vllm-project/vllm/issues/{num}")
    return urls


def patch_entries(line: Line) -> list[Patch]:
    """One CycloneDX patch per patch of the line's series.  The library sorts
    them; each issue's id starts with the patch's number and its description
    says its place in the series.  Advisories that advisories.toml says a patch
    fixes are among its `resolves`, as security issues."""
    _, triage = load_triage(line)
    names = read_series(line.series)
    out = []
    for pos, name in enumerate(names, 1):
        path = line.patches / name
        p = read_patch(path)
        h = p.header
        bug = h.get("Bug") or ""
        related = [u for v in h.get_all("Related") for u in _refs(v)]
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", h.mail_field("Subject") or name)
        issue = IssueType(
            type=IssueClassification.DEFECT,
            id=name,
            name=subject,
            description=f"{name} (sha256 {sha256_file(path)}), patch {pos} of "
            f"{len(names)} in series order"
            + (
                f"; applied upstream: {h.get('Applied-Upstream')}"
                if h.get("Applied-Upstream")
                else ""
            ),
            references=[XsUri(u) for u in [*_refs(bug), *related]],
        )
        kind = (
            PatchClassification.BACKPORT
            if h.get("Applied-Upstream")
            else PatchClassification.UNOFFICIAL
        )
        diff = Diff(text=AttachedText(content=path.read_text(), content_type="text/x-diff"))
        security = [
            IssueType(type=IssueClassification.SECURITY, id=aid, description=e.get("detail"))
            for aid, e in sorted(triage.items())
            if e.get("patch") == name
        ]
        out.append(Patch(type=kind, diff=diff, resolves=[issue, *security]))
    return out


def _metadata(wheel: Path) -> dict:
    msg = wheel_message(wheel)
    return {
        "version": msg["Version"],
        "requires": msg.get_all("Requires-Dist") or [],
        "python": msg.get("Requires-Python"),
        "license": msg.get("License-Expression") or msg.get("License"),
    }


def _requirement(req: str) -> Component:
    from packaging.requirements import Requirement

    r = Requirement(req)
    pinned = [s.version for s in r.specifier if s.operator == "=="]
    version = pinned[0] if len(pinned) == 1 and "*" not in pinned[0] else None
    optional = r.marker is not None and "extra" in str(r.marker)
    return Component(
        type=ComponentType.LIBRARY,
        name=r.name,
        version=version,
        # a range names no package version: no purl, or scanners match it to all
        purl=PackageURL("pypi", name=canonicalize_name(r.name), version=version)
        if version
        else None,
        bom_ref=f"requirement:{req}",
        scope=ComponentScope.OPTIONAL if optional else ComponentScope.REQUIRED,
        properties=[Property(name="tpfix:requirement", value=req)],
    )


def _vex_ref(name: str) -> ExternalReference:
    """Where `python -m tpfix.advisories` writes this SBOM's VEX (beside it)."""
    return ExternalReference(
        type=ExternalReferenceType.EXPLOITABILITY_STATEMENT,
        url=XsUri(f"{name}.vex.cdx.json"),
        comment="written by python -m tpfix.advisories (not by the build: advisories change daily)",
    )


def _upstream(kind: str, path: Path, version: str) -> Component:
    return Component(
        type=ComponentType.LIBRARY,
        name="vllm",
        version=version,
        purl=PackageURL("pypi", name="vllm", version=version, qualifiers={"file_name": path.name}),
        bom_ref=f"upstream:{kind}:{path.name}",
        hashes=[_sha256(sha256_file(path))],
        description=f"upstream {kind}, pinned and verified by sha256",
    )


def wheel_component(wheel: Path, line: Line, sdist: Path, official: Path) -> Component:
    """Our wheel, with its pedigree (upstream inputs and the series)."""
    meta = _metadata(wheel)
    upstream = meta["version"].split("+")[0]
    return Component(
        type=ComponentType.LIBRARY,
        name="vllm",
        version=meta["version"],
        purl=PackageURL(
            "pypi", name="vllm", version=meta["version"], qualifiers={"file_name": wheel.name}
        ),
        bom_ref=f"pkg:pypi/vllm@{meta['version']}",
        hashes=[_sha256(sha256_file(wheel))],
        licenses=[LicenseExpression(meta["license"] or "Apache-2.0")],
        description=f"vLLM {line.tag} with the tpfix series "
        f"({len(read_series(line.series))} patches)",
        external_references=[
            ExternalReference(
                type=ExternalReferenceType.VCS,
                url=XsUri(f"{_GITHUB}vllm-project/vllm/tree/{line.tag}"),
                comment="upstream source at the pinned tag",
            ),
            _vex_ref(wheel.name),
        ],
        properties=[Property(name="tpfix:requires-python", value=meta["python"] or "")],
        pedigree=Pedigree(
            ancestors=[
                _upstream("sdist", sdist, upstream),
                _upstream("wheel", official, upstream),
            ],
            patches=patch_entries(line),
            notes=(
                f"Built from the sdist with the series applied by quilt, in vLLM's "
                f"precompiled mode: the compiled files are the official wheel's, byte "
                f"for byte (tpfix.verify). Scanners: {meta['version']} is vLLM "
                f"{upstream} plus the patches above."
            ),
        ),
    )


def _epoch_time(epoch: str | int) -> datetime:
    return datetime.fromtimestamp(int(epoch), tz=UTC)


def _bom(root: Component, serial_of: str, epoch: str | int) -> Bom:
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"tpfix:{serial_of}"))
    bom.metadata.component = root
    bom.metadata.timestamp = _epoch_time(epoch)
    bom.metadata.tools.components.add(this_component())
    bom.metadata.tools.components.add(
        Component(
            type=ComponentType.APPLICATION,
            name="vllm-tpfix-tools",
            version=metadata.version("vllm-tpfix-tools"),
            description="this repository's scripts/tpfix (build.sh)",
        )
    )
    return bom


def wheel_bom(wheel: Path, line: Line, sdist: Path, official: Path, epoch: str | int) -> Bom:
    root = wheel_component(wheel, line, sdist, official)
    bom = _bom(root, sha256_file(wheel), epoch)
    reqs = [_requirement(r) for r in _metadata(wheel)["requires"]]
    for c in reqs:
        bom.components.add(c)
    bom.register_dependency(root, [c for c in reqs if c.scope == ComponentScope.REQUIRED])
    return bom


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
    inventory: dict, wheel: Component, epoch: str | int, version: str, tag: str, stem: str
) -> Bom:
    """The image's SBOM (<stem>.cdx.json) from tpfix.image.image_inventory() and
    the wheel's component.  The image itself is named by its config digest
    (the image ID): the manifest digest exists only once it is pushed."""
    img = inventory["image"]
    config = img["config_digest"].removeprefix("sha256:")
    root = Component(
        type=ComponentType.CONTAINER,
        name=split_ref(img["ref"])[0],
        version=version,
        bom_ref=f"image:{img['ref']}",
        hashes=[_sha256(config)],
        description=f"vLLM {tag} image with the tpfix wheel (config digest sha256:{config})",
        external_references=[_vex_ref(stem)],
        properties=[Property(name="tpfix:layer", value=d) for d in img["layers"]],
    )
    bom = _bom(root, config, epoch)
    base = inventory["base"]
    digest = base.get("digest")
    base_c = Component(
        type=ComponentType.CONTAINER,
        name=split_ref(base["name"])[0],
        version=split_ref(base["name"])[1],
        bom_ref=f"base:{base['name']}",
        purl=_oci_purl(base["name"], digest) if digest else None,
        hashes=[_sha256(digest.removeprefix("sha256:"))] if digest else [],
        description="base image, by its manifest digest"
        if digest
        else "base image (its digest is not known to local storage)",
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
                properties=[Property(name="tpfix:location", value=dist.get("location", ""))],
            )
        deps.append(c)
    for c in deps:
        bom.components.add(c)
    bom.register_dependency(root, deps)
    return bom


def dumps(bom: Bom) -> str:
    """The BOM as CycloneDX JSON, schema-checked (a Fail names the error)."""
    text = JsonV1Dot6(bom).output_as_string(indent=2) + "\n"
    validate(text)
    return text


def validate(text: str, what: str = "SBOM") -> None:
    err = JsonStrictValidator(SCHEMA).validate_str(text)
    if err is not None:
        raise Fail(f"{what} is not valid CycloneDX {SCHEMA.to_version()}: {err}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="check SBOM files against the CycloneDX schema")
    v.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()
    for f in args.files:
        validate(f.read_text(), str(f))
        print(f"{f}: valid CycloneDX {SCHEMA.to_version()}")


if __name__ == "__main__":
    main_wrapper(main)
