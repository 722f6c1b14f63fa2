# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The wheel's CycloneDX SBOM (`<wheel>.cdx.json`, CycloneDX 1.6 JSON), written
by the package stage (tpfix.stages.package); its root component (our wheel with its
pedigree) is also the image's vLLM (tpfix.image.image_sbom).

  * the root component is our wheel (purl pkg:pypi/vllm@<VERSION>, sha256,
    license), supplied and built by this distribution, authored by the vLLM
    project and this distribution (DISTRIBUTION, UPSTREAM: one place);
  * its pedigree names the exact upstream inputs as ancestors (the pinned
    sdist and the official wheel, with their sha256, supplied by the vLLM
    project) and each patch of the series, in series order, as a patch
    entry: its diff, the upstream issue it resolves (id `owner/repo#N` from
    the header's Bug:, Related: as references, `vllm#N` there linked as
    /pull/N) and what upstream did with it (`applied`, `superseded` by
    another change, `open`; from Applied-Upstream:, Forwarded: and the
    line's rebase.json).  Only an `applied` patch is a backport;
  * every project the wheel's METADATA Requires-Dist names, once, by its
    canonical name: purl pkg:pypi/<name> (@version only when pinned `==`),
    each requirement line (tpfix:requirement), its range in vers form
    (tpfix:version-range, e.g. vers:pypi/>=1.2|<2: CycloneDX 1.6 has no
    versionRange on a component, 1.7 added it), its markers (tpfix:marker);
    optional when only our extras need it.  The root depends on each.

What both SBOMs share (authors, no timestamp, the schema check): tpfix.release.sbom.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from cyclonedx.model import (
    AttachedText,
    ExternalReference,
    ExternalReferenceType,
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
from cyclonedx.model.contact import OrganizationalContact
from cyclonedx.model.issue import IssueClassification, IssueType, IssueTypeSource
from cyclonedx.model.license import LicenseExpression
from packageurl import PackageURL
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from tpfix.core.context import BuildContext
from tpfix.core.lines import Line
from tpfix.core.patch_format import read_patch
from tpfix.core.util import Fail, sha256_file
from tpfix.core.wheelfile import wheel_message, wheel_requirements
from tpfix.release.sbom import (
    DECLARED,
    DISTRIBUTION,
    SUPPLIER_UNKNOWN,
    UPSTREAM,
    distribution,
    new_bom,
    sha256_hash,
    upstream_org,
)
from tpfix.release.triage import load_triage

_GITHUB = "https://github.com/"
_SHORT_REF = re.compile(r"\b([\w.-]+/)?([\w.-]+)?#(\d+)\b")
_URL = re.compile(r"https?://\S+[^\s).,;]")
_ISSUE_URL = re.compile(r"^https://github\.com/([\w.-]+/[\w.-]+)/(?:issues|pull)/(\d+)$")


def _refs(text: str, kind: str = "pull") -> list[str]:
    """The URLs in a header field: links as written, `vllm#123` and
    `owner/repo#123` as GitHub links of `kind` (`pull`: what `Related:` names
    are upstream changes; an issue there is best written as its full URL)."""
    urls = _URL.findall(text)
    for owner, repo, num in _SHORT_REF.findall(_URL.sub("", text)):
        if owner:
            urls.append(f"{_GITHUB}{owner}{repo}/{kind}/{num}")
        elif repo == "vllm":
            urls.append(f"{_GITHUB}vllm-project/vllm/{kind}/{num}")
    return urls


def _issue_id(url: str) -> str:
    """`owner/repo#N` for a GitHub issue or pull request URL, else the URL."""
    m = _ISSUE_URL.match(url)
    return f"{m.group(1)}#{m.group(2)}" if m else url


def _rebase_status(line: Line) -> dict[str, str]:
    """{patch: "rebased from TAG: class"} of the line's rebase.json
    (tpfix.maint.start_line), if it has one."""
    path = line.patches / "rebase.json"
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
        return {n: f"rebased from {doc['from']}: {c}" for n, c in doc["patches"].items()}
    except (ValueError, KeyError, TypeError) as e:
        raise Fail(
            f"{path}: not a rebase summary ({e}); rewrite it with tpfix.maint.start_line"
        ) from None


def upstream_status(header, rebased: str | None) -> tuple[str, str]:
    """(status, short reason) of what upstream did with a patch, from its DEP-3
    header (and the line's rebase.json class): `applied` (upstream has this
    change: forwarded, then Applied-Upstream), `superseded` (upstream fixed it
    with another change: Applied-Upstream, never forwarded), `open` (not
    upstream: forwarded as a pull request, or not yet)."""
    applied = header.get("Applied-Upstream")
    forwarded = (header.get("Forwarded") or "no").strip()
    sent = forwarded.lower() not in ("no", "not-needed")
    if applied:
        status = "applied" if sent else "superseded"
        reason = f"fixed in {applied}" + ("" if sent else ", not by this patch")
    else:
        status = "open"
        reason = f"forwarded as {forwarded}" if sent else "not forwarded"
    return status, f"{reason}; {rebased}" if rebased else reason


def patch_entries(ctx: BuildContext) -> list[Patch]:
    """One CycloneDX patch per patch of the line's series: the upstream issue
    it resolves (its `Bug:`, `Related:` as references), whose description
    names the patch file, its place in the series and what upstream did with
    it.  Advisories that advisories.toml says a patch fixes are among its
    `resolves`, as security issues.  The library sorts patches; `dumps` puts
    them back in series order."""
    line, names = ctx.line, ctx.series
    _, triage = load_triage(line, names)
    rebased = _rebase_status(line)
    out = []
    for pos, name in enumerate(names, 1):
        path = line.patches / name
        h = read_patch(path).header
        bugs = _refs(h.get("Bug") or "", "issues")
        related = [u for v in h.get_all("Related") for u in _refs(v)]
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", h.mail_field("Subject") or name)
        status, reason = upstream_status(h, rebased.get(name))
        issue = IssueType(
            type=IssueClassification.DEFECT,
            id=_issue_id(bugs[0]) if bugs else f"tpfix:{name}",
            name=subject,
            description=f"{name} (sha256 {sha256_file(path)}), patch {pos} of {len(names)} "
            f"in series order; upstream: {status}: {reason}",
            source=IssueTypeSource(name="GitHub", url=XsUri(bugs[0])) if bugs else None,
            references=[XsUri(u) for u in [*bugs, *related]],
        )
        kind = (
            PatchClassification.BACKPORT if status == "applied" else PatchClassification.UNOFFICIAL
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
        "requires": wheel_requirements(wheel),
        "python": msg.get("Requires-Python"),
        "license": msg.get("License-Expression") or msg.get("License"),
    }


def _bump(release: tuple[int, ...]) -> Version:
    """The first version past every `release.*` (1.2 -> 1.3)."""
    return Version(".".join(map(str, [*release[:-1], release[-1] + 1])))


_INF = None  # an unbounded end of an interval


def _intervals(spec) -> list[tuple]:
    """The versions one PEP 440 clause allows, as intervals (lo, lo_incl, hi, hi_incl)."""
    op, v = spec.operator, spec.version
    if v.endswith(".*"):
        base = Version(v[:-2])
        lo, hi = base, _bump(base.release)
        inside = [(lo, True, hi, False)]
        return inside if op == "==" else [(_INF, False, lo, False), (hi, True, _INF, False)]
    ver = Version(v)
    if op in ("==", "==="):
        return [(ver, True, ver, True)]
    if op == "!=":
        return [(_INF, False, ver, False), (ver, False, _INF, False)]
    if op == "~=":  # ~=1.4.2: >=1.4.2, ==1.4.*
        return [(ver, True, _bump(ver.release[:-1]), False)]
    if op in (">=", ">"):
        return [(ver, op == ">=", _INF, False)]
    return [(_INF, False, ver, op == "<=")]


def _meet(a: tuple, b: tuple) -> tuple | None:
    def lower(x, y):  # the higher of two lower ends
        if x[0] is _INF or (y[0] is not _INF and (y[0], not y[1]) > (x[0], not x[1])):
            return y
        return x

    def upper(x, y):  # the lower of two upper ends
        if x[0] is _INF or (y[0] is not _INF and (y[0], y[1]) < (x[0], x[1])):
            return y
        return x

    lo = lower(a[:2], b[:2])
    hi = upper(a[2:], b[2:])
    bounded = lo[0] is not _INF and hi[0] is not _INF
    if bounded and (lo[0] > hi[0] or (lo[0] == hi[0] and not (lo[1] and hi[1]))):
        return None
    return (*lo, *hi)


def vers(specifier: SpecifierSet) -> str | None:
    """A PEP 440 specifier set in vers form (vers:pypi/>=1.2|<2), None if it
    names no version or uses a version vers cannot order."""
    try:
        allowed = [(_INF, False, _INF, False)]
        for spec in specifier:
            allowed = [m for a in allowed for b in _intervals(spec) if (m := _meet(a, b))]
    except InvalidVersion:
        return None
    if not allowed:
        return None
    allowed.sort(key=lambda i: (i[0] is not _INF, i[0] or Version("0")))
    out: list[str] = []
    for n, (lo, lo_in, hi, hi_in) in enumerate(allowed):
        if lo is not _INF and lo == hi:
            out.append(str(lo))
            continue
        if lo is not _INF:
            prev = allowed[n - 1] if n else None
            if prev and prev[2] == lo and not prev[3] and not lo_in and out and out[-1] == f"<{lo}":
                out[-1] = f"!={lo}"  # one version left out between two intervals
            else:
                out.append(f"{'>=' if lo_in else '>'}{lo}")
        if hi is not _INF:
            out.append(f"{'<=' if hi_in else '<'}{hi}")
    return "vers:pypi/" + ("|".join(out) or "*")


def requirement_components(requires: list[Requirement]) -> list[Component]:
    """One component per project the wheel's Requires-Dist names (canonical
    name), however many lines name it: each line (marker and extras as
    written) and its range (vers) kept as properties, the pin as version and
    purl version where all lines pin the same `==` version; optional when
    only extras of ours need it."""
    by_name: dict[str, list[Requirement]] = {}
    for r in requires:
        by_name.setdefault(canonicalize_name(r.name), []).append(r)
    out = []
    for name, reqs in sorted(by_name.items()):
        lines = list(dict.fromkeys(str(r) for r in reqs))
        pins = {s.version for r in reqs for s in r.specifier if s.operator == "=="}
        exact = all(
            len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in reqs
        )
        version = pins.pop() if exact and len(pins) == 1 and "*" not in next(iter(pins)) else None
        ranges = dict.fromkeys(v for r in reqs if (v := vers(r.specifier)))
        markers = dict.fromkeys(str(r.marker) for r in reqs if r.marker is not None)
        required = any(r.marker is None or "extra" not in str(r.marker) for r in reqs)
        out.append(
            Component(
                type=ComponentType.LIBRARY,
                name=name,
                version=version,
                purl=PackageURL("pypi", name=name, version=version),
                bom_ref=f"requirement:{name}",
                scope=ComponentScope.REQUIRED if required else ComponentScope.OPTIONAL,
                properties=[
                    *(Property(name="tpfix:requirement", value=x) for x in lines),
                    *(Property(name="tpfix:version-range", value=x) for x in ranges),
                    *(Property(name="tpfix:marker", value=x) for x in markers),
                    Property(name="tpfix:supplier", value=SUPPLIER_UNKNOWN),
                ],
            )
        )
    return out


def _upstream(kind: str, path: Path, version: str, license: str) -> Component:
    return Component(
        type=ComponentType.LIBRARY,
        name="vllm",
        version=version,
        purl=PackageURL("pypi", name="vllm", version=version, qualifiers={"file_name": path.name}),
        bom_ref=f"upstream:{kind}:{path.name}",
        supplier=upstream_org(),
        authors=[OrganizationalContact(name=UPSTREAM)],
        hashes=[sha256_hash(sha256_file(path))],
        licenses=[LicenseExpression(license)],
        description=f"upstream {kind}, pinned and verified by sha256",
    )


def wheel_component(wheel: Path, ctx: BuildContext, sdist: Path, official: Path) -> Component:
    """Our wheel, with its pedigree (upstream inputs and the series)."""
    line = ctx.line
    meta = _metadata(wheel)
    upstream = meta["version"].split("+")[0]
    license = meta["license"] or "Apache-2.0"
    patches = patch_entries(ctx)
    rebased = _rebase_status(line)
    status = "; ".join(
        f"{name.split('-', 1)[0]} "
        + upstream_status(read_patch(line.patches / name).header, rebased.get(name))[0]
        for name in ctx.series
    )
    return Component(
        type=ComponentType.LIBRARY,
        name="vllm",
        version=meta["version"],
        purl=PackageURL(
            "pypi", name="vllm", version=meta["version"], qualifiers={"file_name": wheel.name}
        ),
        bom_ref=f"pkg:pypi/vllm@{meta['version']}",
        supplier=distribution(),
        manufacturer=distribution(),
        authors=[OrganizationalContact(name=UPSTREAM), OrganizationalContact(name=DISTRIBUTION)],
        hashes=[sha256_hash(sha256_file(wheel))],
        licenses=[LicenseExpression(license)],
        description=f"vLLM {line.tag} with the tpfix series ({len(ctx.series)} patches)",
        external_references=[
            ExternalReference(
                type=ExternalReferenceType.VCS,
                url=XsUri(f"{_GITHUB}vllm-project/vllm/tree/{line.tag}"),
                comment="upstream source at the pinned tag",
            ),
        ],
        properties=[Property(name="tpfix:requires-python", value=meta["python"] or "")],
        pedigree=Pedigree(
            ancestors=[
                _upstream("sdist", sdist, upstream, license),
                _upstream("wheel", official, upstream, license),
            ],
            patches=patches,
            notes=(
                f"Built from the sdist with the series applied by quilt, in vLLM's "
                f"precompiled mode: the compiled files are the official wheel's, byte "
                f"for byte (tpfix.stages.verify). Scanners: {meta['version']} is vLLM "
                f"{upstream} plus the patches above. Upstream, by patch: {status}."
            ),
        ),
    )


def wheel_bom(wheel: Path, ctx: BuildContext, sdist: Path, official: Path, epoch: str | int) -> Bom:
    root = wheel_component(wheel, ctx, sdist, official)
    bom = new_bom(root, sha256_file(wheel), epoch, ctx.version)
    bom.metadata.properties.add(Property(name="tpfix:inventory", value=DECLARED))
    reqs = requirement_components(_metadata(wheel)["requires"])
    for c in reqs:
        bom.components.add(c)
    bom.register_dependency(root, reqs)  # optional ones: scope optional
    return bom
