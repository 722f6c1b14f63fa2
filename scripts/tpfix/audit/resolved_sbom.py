# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The resolved SBOM: what the wheel installs on the line's reference platform.

    python -m tpfix.audit.resolved_sbom                   # the default line's dist/
    python -m tpfix.audit.resolved_sbom --line v0.33.0    # dist/v0.33.0/
    python -m tpfix.audit.resolved_sbom [--arch aarch64] [--index-url URL] [--sign-key KEY]

Without --arch, one for each arch's wheel dist/ lists (./build.sh --arch all:
both), all of them written or none.

The wheel's SBOM (<wheel>.cdx.json, tpfix.release.sbom) lists what the wheel declares:
its Requires-Dist ranges.  A scanner wants what gets installed, so this step
writes <wheel>.resolved.cdx.json beside it (CycloneDX 1.6) and adds it to
SHA256SUMS (signed again with --sign-key, as tpfix.audit.advisories does):

  * the set is the one the advisories audit (tpfix.audit.resolution): uv pip compile
    of the wheel, without extras, for the official image's CPython (the pins'
    `image-python`) on manylinux for the wheel's arch, binary wheels only,
    from the index uv is configured with or --index-url;
  * every component: the exact version, purl pkg:pypi/<name>@<version>, the
    sha256 of the wheel uv locked for the target and that wheel's URL, and a
    license where the wheel's core metadata states one: License-Expression,
    else a short one-line License (an SPDX id where it is one), else the
    license the first line of a longer License names, else its
    `License ::` classifiers (SPDX ids where a classifier names exactly one
    license: CLASSIFIER_SPDX; names otherwise; tpfix:license-source says
    which); none where it states none.  The
    metadata is read as PEP 658 publishes it (<wheel URL>.metadata, from the
    index uv resolved from), or where the index serves none, from the wheel's
    own METADATA by HTTP byte ranges (its central directory and that file,
    at most 16 MiB): no wheel is downloaded;
  * the root is our wheel (the bom-ref of the wheel's SBOM, which it links);
    the dependency graph is each package's Requires-Dist that applies on the
    target (with the extras another package asks of it);
  * a `compositions` aggregate `complete` for that graph, and metadata
    properties saying for which platform and Python, how and when it was
    resolved, and what it leaves out.

It depends on the index today, so it is a separate step, not part of
./build.sh.  If the resolution or a metadata file fails, it exits 2 with one
line and writes nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path

from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.contrib.this.builders import this_component
from cyclonedx.model import (
    ExternalReference,
    ExternalReferenceType,
    Property,
    XsUri,
)
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.contact import OrganizationalContact, OrganizationalEntity
from cyclonedx.model.license import (
    DisjunctiveLicense,
    LicenseAcknowledgement,
    LicenseExpression,
)
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL
from packaging.markers import Marker
from packaging.utils import canonicalize_name, canonicalize_version

from tpfix.audit.resolution import lock, pick_wheel, target, uv_version
from tpfix.core.lines import Line, read_version
from tpfix.core.util import Fail, main_wrapper
from tpfix.core.wheelfile import parse_metadata, requirements, wheel_arch, wheel_message
from tpfix.release import sbom
from tpfix.stages.package import add_dist_step_args, add_to_dist, dist_step, find_wheels

SUFFIX = ".resolved.cdx.json"
SHORT_LICENSE = 64  # a License field longer than this, or of several lines, is a text
INVENTORY = (
    "resolved: every Python package the wheel installs with (no extras of vllm) on "
    "{platform} with CPython {python}, the official image's, at the version uv resolved "
    "and the sha256 of the wheel it locked; not the image (OS packages, CUDA libraries "
    "outside Python packages, what the image adds: the image's SBOM lists those), not "
    "another platform or Python; the wheel's declared ranges are in {declared}"
)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


RANGE_BUDGET = 16 << 20  # bytes of a wheel read by range: its central directory and METADATA


class _Ranges(io.RawIOBase):
    """The file at `url` as a seekable file read with HTTP Range requests
    (what pip's lazy wheel does), so that zipfile reads a wheel's central
    directory and one member: kB of a wheel that may be GBs.  An index that
    does not answer ranges (206), or a read past RANGE_BUDGET, is an OSError."""

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout, self.pos, self.left = url, timeout, 0, RANGE_BUDGET
        head = self._get("bytes=-1")
        self.size = int(head.headers["Content-Range"].rsplit("/", 1)[1])

    def _get(self, spec: str):
        req = urllib.request.Request(self.url, headers={"Range": spec})
        r = urllib.request.urlopen(req, timeout=self.timeout)  # noqa: S310
        if r.status != 206 or "Content-Range" not in r.headers:
            r.close()
            raise OSError(f"the index answers no byte ranges (HTTP {r.status})")
        return r

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        self.left -= n
        if self.left < 0:
            raise OSError(f"more than {RANGE_BUDGET >> 20} MiB of the wheel read by range")
        with self._get(f"bytes={self.pos}-{self.pos + n - 1}") as r:
            data = r.read()
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _metadata_by_range(url: str, timeout: float) -> str:
    """The wheel's own METADATA (its top-level *.dist-info/METADATA), read
    from the wheel at `url` by byte ranges."""
    with zipfile.ZipFile(io.BufferedReader(_Ranges(url, timeout), 1 << 18)) as z:
        names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise OSError(f"the wheel holds {len(names)} top-level .dist-info/METADATA files")
        return z.read(names[0]).decode("utf-8")


def fetch_metadata(url: str, name: str, version: str, timeout: float = 60) -> Message:
    """The core metadata of the wheel at `url`, as PEP 658 serves it beside the
    wheel (`<url>.metadata`), else (HTTP 404: an index that serves none) read
    from the wheel itself by byte ranges; it must name `name` and `version`."""
    wheel_url = url.split("#", 1)[0]
    meta_url = wheel_url + ".metadata"
    try:
        try:
            with urllib.request.urlopen(meta_url, timeout=timeout) as r:  # noqa: S310
                text = r.read().decode("utf-8")
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
            meta_url = wheel_url  # no PEP 658 file: the wheel's own, by range
            text = _metadata_by_range(wheel_url, timeout)
    except (urllib.error.URLError, OSError, UnicodeDecodeError, zipfile.BadZipFile) as e:
        why = getattr(e, "reason", None) or e
        raise Fail(
            f"the core metadata of {name} {version} could not be read from "
            f"{_redacted(meta_url)} ({_one_line(why)}), so its license is not known "
            "and nothing was written"
        ) from None
    meta = parse_metadata(text)
    got = (canonicalize_name(meta.get("Name", "")), meta.get("Version", ""))
    if got[0] != canonicalize_name(name) or canonicalize_version(got[1]) != canonicalize_version(
        version
    ):
        raise Fail(
            f"{_redacted(meta_url)} describes {got[0]} {got[1]}, not {name} {version}: "
            "the index does not serve the wheel's own metadata; nothing was written"
        )
    return meta


def _redacted(url: str) -> str:
    """`url` without user:password (an index's credentials stay out of files)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urllib.parse.urlunsplit(
        parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host)
    )


def licenses_of(meta: Message) -> tuple[list, str | None]:
    """The licenses the metadata states, and the field they come from: its
    License-Expression, else a short License, else its `License ::`
    classifiers; ([], None) where it states none."""
    declared = LicenseAcknowledgement.DECLARED
    expr = (meta.get("License-Expression") or "").strip()
    if expr:
        return [LicenseExpression(expr, acknowledgement=declared)], "License-Expression"
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= SHORT_LICENSE and text.upper() != "UNKNOWN":
        return [
            LicenseFactory().make_from_string(text, license_acknowledgement=declared)
        ], "License"
    named = _first_line_license(text.splitlines()[0].strip()) if "\n" in text else None
    if named is not None:
        return [named], "License, first line"
    names = [
        c.split("::")[-1].strip()
        for c in meta.get_all("Classifier") or []
        if c.startswith("License ::") and c.strip() != "License :: OSI Approved"
    ]
    if names:
        found = [
            DisjunctiveLicense(id=CLASSIFIER_SPDX[n], acknowledgement=declared)
            if n in CLASSIFIER_SPDX
            else DisjunctiveLicense(name=n, acknowledgement=declared)
            for n in dict.fromkeys(names)
        ]
        return found, "classifier"
    return [], None


def _first_line_license(line: str):
    """The license the first line of a License text names (tiktoken's "MIT
    License", then the text): an SPDX id, or a classifier's name
    (CLASSIFIER_SPDX: its id), or else a short line ending in "License" (a
    name: "BSD 3-Clause License", "GNU GENERAL PUBLIC LICENSE"); None for
    any other line (a copyright line, say: nothing is guessed)."""
    from cyclonedx import spdx

    declared = LicenseAcknowledgement.DECLARED
    if line in CLASSIFIER_SPDX or spdx.is_supported_id(line):
        return DisjunctiveLicense(id=CLASSIFIER_SPDX.get(line, line), acknowledgement=declared)
    if len(line) <= SHORT_LICENSE and line.lower().endswith("license"):
        return DisjunctiveLicense(name=line, acknowledgement=declared)
    return None


# `License ::` classifiers that name exactly one SPDX license (their id);
# the others (the "Apache Software License" and "BSD License" of any version
# or clause count, say) stay names: an id would be a guess.
CLASSIFIER_SPDX = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "Python Software Foundation License": "PSF-2.0",
    "The Unlicense (Unlicense)": "Unlicense",
    "Zero-Clause BSD (0BSD)": "0BSD",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "Eclipse Public License 2.0 (EPL-2.0)": "EPL-2.0",
    "zlib/libpng License": "Zlib",
    "GNU General Public License v2 (GPLv2)": "GPL-2.0-only",
    "GNU General Public License v2 or later (GPLv2+)": "GPL-2.0-or-later",
    "GNU General Public License v3 (GPLv3)": "GPL-3.0-only",
    "GNU General Public License v3 or later (GPLv3+)": "GPL-3.0-or-later",
    "GNU Lesser General Public License v2 (LGPLv2)": "LGPL-2.0-only",
    "GNU Lesser General Public License v2 or later (LGPLv2+)": "LGPL-2.0-or-later",
    "GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0-only",
    "GNU Lesser General Public License v3 or later (LGPLv3+)": "LGPL-3.0-or-later",
    "GNU Affero General Public License v3": "AGPL-3.0-only",
    "GNU Affero General Public License v3 or later (AGPLv3+)": "AGPL-3.0-or-later",
}


def _applies(req, env: dict, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    marker = Marker(str(req.marker))
    return any(marker.evaluate({**env, "extra": e}) for e in ["", *sorted(extras)])


def dependency_graph(requires: dict[str, list], env: dict, root: str) -> dict[str, set[str]]:
    """{package: the packages of the set it depends on}: each package's
    requirements that apply on the target, with the extras the packages that
    depend on it ask for (the root: none)."""
    extras: dict[str, set[str]] = {n: set() for n in requires}
    edges: dict[str, set[str]] = {n: set() for n in requires}
    changed = True
    while changed:
        changed = False
        for name, reqs in requires.items():
            for r in reqs:
                dep = canonicalize_name(r.name)
                if dep not in requires or not _applies(r, env, extras[name]):
                    continue
                new = {canonicalize_name(e) for e in r.extras} - extras[dep]
                if dep not in edges[name] or new:
                    edges[name].add(dep)
                    extras[dep] |= new
                    changed = True
    edges[root].discard(root)
    return edges


def _properties(source: str | None) -> list[Property]:
    return [
        Property(name="tpfix:license-source", value=source or "none stated in its metadata"),
        Property(name="tpfix:supplier", value=sbom.SUPPLIER_UNKNOWN),
    ]


def resolved_bom(
    wheel: Path, digest: str, line: Line, tgt: dict, packages: list[dict], metas: dict, how: dict
) -> Bom:
    """The resolved SBOM of `wheel` from the locked `packages` and the core
    metadata of each ({canonical name: Message})."""
    distribution = OrganizationalEntity(name=sbom.DISTRIBUTION)
    own = wheel_message(wheel)
    version = own["Version"]
    root_licenses, root_source = licenses_of(own)
    root = Component(
        type=ComponentType.LIBRARY,
        name="vllm",
        version=version,
        purl=PackageURL("pypi", name="vllm", version=version, qualifiers={"file_name": wheel.name}),
        bom_ref=f"pkg:pypi/vllm@{version}",  # the root of the wheel's SBOM
        supplier=distribution,
        manufacturer=distribution,
        hashes=[sbom.sha256_hash(digest)],
        licenses=root_licenses,
        external_references=[
            ExternalReference(
                type=ExternalReferenceType.BOM,
                url=XsUri(f"{wheel.name}.cdx.json"),
                comment="the wheel's SBOM: its pedigree (upstream, the series) and the "
                "requirements as it declares them",
            )
        ],
        properties=_properties(root_source)[:1],
    )
    comps = {"vllm": root}
    for p in packages:
        name = canonicalize_name(p["name"])
        if name == "vllm":
            continue
        w = pick_wheel(p, tgt)
        found, source = licenses_of(metas[name])
        url = XsUri(_redacted(w["url"]))
        comps[name] = Component(
            type=ComponentType.LIBRARY,
            name=name,
            version=p["version"],
            purl=PackageURL("pypi", name=name, version=p["version"]),  # the wheel: its URL
            bom_ref=f"pkg:pypi/{name}@{p['version']}",
            hashes=[sbom.sha256_hash(w["hashes"]["sha256"])],
            licenses=found,
            external_references=[
                ExternalReference(
                    type=ExternalReferenceType.DISTRIBUTION,
                    url=url,
                    hashes=[sbom.sha256_hash(w["hashes"]["sha256"])],
                    comment="the wheel uv locked for the target",
                )
            ],
            properties=_properties(source),
        )
    requires = {
        n: requirements(own if n == "vllm" else metas[n], f"{n}'s core metadata") for n in comps
    }
    bom = Bom(serial_number=uuid.uuid4())
    bom.metadata.timestamp = datetime.fromisoformat(how["resolved at"])
    bom.metadata.component = root
    bom.metadata.authors.add(OrganizationalContact(name=sbom.DISTRIBUTION))
    bom.metadata.supplier = distribution
    bom.metadata.manufacturer = distribution
    bom.metadata.tools.components.add(this_component())
    bom.metadata.tools.components.add(
        Component(
            type=ComponentType.APPLICATION,
            name="vllm-tpfix-tools",
            version=read_version(line.version_file),
            supplier=distribution,
            description="this repository's scripts/tpfix (tpfix.audit.resolved_sbom)",
        )
    )
    uv_name, _, uv_ver = how["uv"].partition(" ")
    bom.metadata.tools.components.add(
        Component(type=ComponentType.APPLICATION, name=uv_name, version=uv_ver.split(" ")[0])
    )
    for key, value in [
        ("tpfix:inventory", how["inventory"]),
        ("tpfix:platform", tgt["platform"]),
        ("tpfix:python", f"CPython {tgt['python']} (the official image's: pins image-python)"),
        ("tpfix:resolved-by", how["command"]),
        ("tpfix:index", how["index"]),
        ("tpfix:resolved-at", how["resolved at"]),
        ("tpfix:extras", "none of vllm's; the extras its dependencies ask of each other"),
        (
            "tpfix:license",
            "as each wheel's core metadata states it (declared), none where "
            "it states none: License-Expression, else a short License, else License :: "
            "classifiers",
        ),
    ]:
        bom.metadata.properties.add(Property(name=key, value=value))
    for c in comps.values():
        if c is not root:
            bom.components.add(c)
    for name, deps in dependency_graph(requires, tgt["env"], "vllm").items():
        bom.register_dependency(comps[name], [comps[d] for d in sorted(deps)])
    return bom


def dumps(bom: Bom) -> str:
    """CycloneDX 1.6 JSON with its compositions, checked twice: the JSON
    schema (tpfix.release.sbom.validate) and cyclonedx-python-lib's own
    deserializer, which must read back every component as written."""
    doc = json.loads(JsonV1Dot6(bom).output_as_string())
    refs = [doc["metadata"]["component"]["bom-ref"], *(c["bom-ref"] for c in doc["components"])]
    doc["compositions"] = [{"aggregate": "complete", "dependencies": refs}]
    text = json.dumps(doc, indent=2) + "\n"
    sbom.validate(text, "the resolved SBOM")
    back = Bom.from_json(json.loads(text))  # type: ignore[attr-defined]
    read = {(c.bom_ref.value, str(c.purl), c.hashes[0].content) for c in back.components}
    wrote = {(c["bom-ref"], c["purl"], c["hashes"][0]["content"]) for c in doc["components"]}
    if read != wrote:
        raise Fail(f"the resolved SBOM does not read back as written: {sorted(read ^ wrote)}")
    return text


def build(wheel: Path, digest: str, line: Line, index_url: str | None, workers: int = 8) -> str:
    """The resolved SBOM's text (nothing is written here)."""
    tgt = target(line, wheel_arch(wheel))
    packages = lock(wheel, tgt, index_url, "so no resolved SBOM was written", tail=0)
    others = [p for p in packages if canonicalize_name(p["name"]) != "vllm"]
    chosen = [pick_wheel(p, tgt) for p in others]
    with ThreadPoolExecutor(workers) as pool:
        fetched = pool.map(
            lambda pw: fetch_metadata(pw[1]["url"], pw[0]["name"], pw[0]["version"]),
            zip(others, chosen, strict=True),
        )
        metas = {canonicalize_name(p["name"]): m for p, m in zip(others, fetched, strict=True)}
    how = {
        "uv": uv_version(),
        "command": f"uv pip compile 'vllm @ {wheel.name}' --format pylock.toml "
        f"--python-version {tgt['python']} --python-platform {tgt['platform']} "
        "--only-binary :all: (tpfix.audit.resolution)",
        "index": _redacted(index_url) if index_url else "the index uv is configured with",
        "resolved at": datetime.now(UTC).isoformat(timespec="seconds"),
        "inventory": INVENTORY.format(
            platform=tgt["platform"], python=tgt["python"], declared=f"{wheel.name}.cdx.json"
        ),
    }
    return dumps(resolved_bom(wheel, digest, line, tgt, packages, metas, how))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dist_step_args(ap, every_arch=True)
    args = ap.parse_args()
    with dist_step(args, "resolve another folder: --dist DIR") as (line, dist, signer):
        texts = {}
        for wheel, digest in find_wheels(dist, args.arch):  # each arch's, all or none written
            texts[Path(f"{wheel.name}{SUFFIX}")] = text = build(wheel, digest, line, args.index_url)
            n = len(json.loads(text)["components"])
            print(f"{wheel_arch(wheel)}: {n} resolved components", file=sys.stderr)
        for path in add_to_dist(dist, texts, signer=signer):
            print(path)


if __name__ == "__main__":
    main_wrapper(main)
