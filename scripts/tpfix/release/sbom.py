# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""CycloneDX SBOMs of the wheel and of the image: what both share, and the check.

cyclonedx-python-lib: the document around a root component (new_bom), the
JSON it is written as (dumps) and the CycloneDX schema check (validate).

The wheel's SBOM is made by tpfix.release.wheel_sbom (the package stage), the
image's by tpfix.image.image_sbom (tpfix.image.image); tpfix.audit.resolved_sbom and
tpfix.audit.advisories use the names and the checks here too.

Both name this distribution as author, supplier and manufacturer of the
SBOM, the tools with their versions (ours: the line's VERSION), and say
where a component's supplier is not known here (tpfix:supplier).  Neither
links a VEX: `python -m tpfix.audit.advisories` writes one later, and it links to
the SBOM.  Both are reproducible: the serial number derives from the
subject's sha256, and there is no timestamp (CycloneDX allows none; the
metadata property tpfix:timestamp says so and gives SOURCE_DATE_EPOCH).
Each is validated against the CycloneDX schema before it is written (dumps).

    python -m tpfix.release.sbom validate FILE...     # schema-check SBOMs
"""

from __future__ import annotations

import argparse
import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

from cyclonedx.contrib.this.builders import this_component
from cyclonedx.model import HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.contact import OrganizationalContact, OrganizationalEntity
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from tpfix.core.util import Fail, main_wrapper

SCHEMA = SchemaVersion.V1_6

# Who makes what, as the SPDX headers say: this distribution (the wheel, the
# image, the patches, these SBOMs) and upstream vLLM (the sdist, the official
# wheel, the code they carry).
DISTRIBUTION = "Contributors to the vLLM tpfix distribution"
UPSTREAM = "Contributors to the vLLM project"
UPSTREAM_URL = "https://github.com/vllm-project/vllm"
# What a dependency component says where its supplier is not known here: a
# requirement names a project, not who made the release that gets installed.
SUPPLIER_UNKNOWN = "unknown: not recorded in the metadata this SBOM is made from"
# CycloneDX allows no timestamp; ours would be the build's clock (two builds of
# the same inputs would differ) or SOURCE_DATE_EPOCH (the upstream sdist's
# date, months before the build).  So there is none, and the SBOM says so.
NO_TIMESTAMP = (
    "omitted: this SBOM is reproducible (the same inputs give the same bytes); "
    "the files it describes are dated SOURCE_DATE_EPOCH={epoch} ({date}, the upstream sdist's)"
)


# What the wheel's SBOM holds and what it does not: said in a metadata
# property (tpfix.release.wheel_sbom.wheel_bom), and to tools in a compositions
# aggregate (dumps adds it where that property says this).
DECLARED = (
    "declared, not resolved: the wheel's Requires-Dist, one component per project, "
    "versions as the ranges it declares (tpfix:version-range); no transitive "
    "dependencies and no installed versions (the image's SBOM lists what an image "
    "installs); OS packages and the CUDA libraries outside Python packages are not listed"
)


def distribution() -> OrganizationalEntity:
    return OrganizationalEntity(name=DISTRIBUTION)


def upstream_org() -> OrganizationalEntity:
    return OrganizationalEntity(name=UPSTREAM, urls=[XsUri(UPSTREAM_URL)])


def sha256_hash(hexdigest: str) -> HashType:
    return HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)


def new_bom(root: Component, serial_of: str, epoch: str | int, tool_version: str) -> Bom:
    """The document around `root`: serial number from `serial_of` (a sha256),
    no timestamp (NO_TIMESTAMP says why), this distribution as its author,
    the tools that wrote it with their versions (ours: the release, VERSION)."""
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"tpfix:{serial_of}"))
    bom.metadata.component = root
    bom.metadata.timestamp = None
    date = datetime.fromtimestamp(int(epoch), tz=UTC).isoformat()
    bom.metadata.properties.add(
        Property(name="tpfix:timestamp", value=NO_TIMESTAMP.format(epoch=epoch, date=date))
    )
    bom.metadata.authors.add(OrganizationalContact(name=DISTRIBUTION))
    bom.metadata.supplier = distribution()
    bom.metadata.manufacturer = distribution()
    bom.metadata.tools.components.add(this_component())
    bom.metadata.tools.components.add(
        Component(
            type=ComponentType.APPLICATION,
            name="vllm-tpfix-tools",
            version=tool_version,
            supplier=distribution(),
            description="this repository's scripts/tpfix (build.sh), at the release it built "
            "(VERSION; the provenance names the commit)",
        )
    )
    return bom


# Each patch's defect says its place (tpfix.release.wheel_sbom.patch_entries writes it).
_SERIES_PLACE = re.compile(r", patch (\d+) of \d+ in series order;")


def _series_order(doc: dict) -> None:
    """Every pedigree's patches in series order (the place each defect's
    description names), wherever cyclonedx-python-lib sorted them."""

    def place(patch: dict) -> int:
        for issue in patch.get("resolves", []):
            m = _SERIES_PLACE.search(issue.get("description", ""))
            if m:
                return int(m.group(1))
        return 0

    for c in [doc.get("metadata", {}).get("component") or {}, *doc.get("components", [])]:
        patches = c.get("pedigree", {}).get("patches")
        if patches:
            patches.sort(key=place)


def dumps(bom: Bom) -> str:
    """The BOM as CycloneDX JSON, schema-checked (a Fail names the error)."""
    doc = json.loads(JsonV1Dot6(bom).output_as_string())
    _series_order(doc)
    props = {p["name"]: p["value"] for p in doc["metadata"].get("properties", [])}
    if props.get("tpfix:inventory") == DECLARED:  # the wheel's: its graph is first-party only
        root = doc["metadata"]["component"]["bom-ref"]
        doc["compositions"] = [
            {
                "aggregate": "incomplete_first_party_only",
                "assemblies": [root],
                "dependencies": [root],
            }
        ]
    text = json.dumps(doc, indent=2) + "\n"
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
