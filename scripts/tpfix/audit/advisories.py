# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Known advisories for what a built wheel ships, and our VEX on each (pip-audit).

    python -m tpfix.audit.advisories                  # the default line's dist/
    python -m tpfix.audit.advisories --line v0.33.0   # dist/v0.33.0/
    python -m tpfix.audit.advisories --image dist/image/NAME.cdx.json   # an image's environment
    python -m tpfix.audit.advisories --requirements PINNED.txt         # a pinned set of your own
    python -m tpfix.audit.advisories --service osv [--osv-url URL] [--index-url URL]

1. The dependency set.  By default uv resolves (tpfix.audit.resolution) the wheel as the official
   image installs it: that image's Python (the pins' `image-python`) and
   platform (manylinux for the glibc of the Ubuntu its docker/Dockerfile
   names), binary wheels only, markers evaluated for that target (pip's
   --python-version would evaluate them for this host).  Or `--image` takes
   every Python distribution the image's SBOM lists, or `--requirements` a
   pinned set.  Whatever the source, every requirement of the wheel that
   applies on the target (no extras) must be in the set, or it stops.
   Local versions are audited as their public one: scanners read
   0.27.1+tpfix.3 as 0.27.1 and torch 2.13.0+cu130 as 2.13.0, so their
   advisories are ours unless the series fixes them.  Extras are not audited.
2. pip-audit checks each project against the advisory service: the package
   index's advisory data by default (`-s pypi`), OSV with --service osv.
3. Written beside the SBOM audited (dist/ or dist/image/), added to SHA256SUMS:
     <name>.advisories.json   pip-audit's report, with how the set was made
                              and when, the service, pip-audit's version
     <name>.vex.cdx.json      CycloneDX VEX: each advisory, the component it
                              affects (a BOM-Link into <name>.cdx.json, or a
                              component of its own for a project the SBOM
                              does not list) and our analysis from the line's
                              advisories.toml; one it does not name is `in_triage`.
   The VEX links to the SBOM (the SBOM, written by the build, does not name
   this later file), and each advisory advisories.toml says a patch fixes is
   in that patch's `resolves` in the SBOM.

Advisory data changes every day while the wheel does not, so this is a
separate step, not part of ./build.sh: the build stays reproducible and does
not depend on a service.  If the set cannot be resolved, the source cannot be
reached, or a single project could not be audited, it says so and exits 2,
writing nothing: it never reports "no advisories" for what it did not check.
A source that cannot be reached, answers an HTTP error, or knows none of the
projects (PyPI's per-release API behind a proxy) is named in one line with
the other source to try (--service osv / --service pypi); a list that is cut
says how many it left out.

advisories.toml (beside the line's series):
    [[advisory]]
    id = "GHSA-..."            # or a PYSEC/CVE id: matched against aliases too
    state = "not_affected"     # CycloneDX: resolved, resolved_with_pedigree, exploitable,
                               #   false_positive, in_triage, not_affected
    justification = "..."      # not_affected: code_not_present, code_not_reachable, ...
    patch = "0002-....patch"   # a patch of the series fixes it: resolved_with_pedigree
    detail = "..."
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from hashlib import sha256
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from tpfix.audit.resolution import needed, resolve, target
from tpfix.core.lines import Line
from tpfix.core.util import Fail, main_wrapper, shown
from tpfix.core.wheelfile import wheel_arch
from tpfix.release.triage import load_triage
from tpfix.stages.package import add_dist_step_args, add_to_dist, dist_step, find_wheel


def read_requirements(path: Path) -> list[tuple[str, str]]:
    out = []
    for ln in path.read_text().splitlines():
        ln = ln.split("#", 1)[0].strip()
        if not ln:
            continue
        name, sep, version = ln.partition("==")
        if not sep:
            raise Fail(f"{path}: {ln!r} is not pinned (name==version)")
        out.append((name.strip(), version.strip()))
    return out


def image_pins(bom_path: Path) -> list[tuple[str, str]]:
    """The Python distributions an image's SBOM lists (tpfix.image.image_sbom.image_bom)."""
    doc = json.loads(bom_path.read_text())
    comps = [doc["metadata"]["component"], *doc.get("components", [])]
    return sorted(
        {
            (c["name"], c["version"])
            for c in comps
            if c.get("purl", "").startswith("pkg:pypi/") and c.get("version")
        }
    )


def public(pins: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every pin at its public version (what scanners read a local version as),
    one per project."""
    out = {}
    for n, v in pins:
        out[canonicalize_name(n)] = (n, v.split("+")[0])
    return sorted(out.values())


def check_covers(pins: list[tuple[str, str]], need: set[str], what: str) -> None:
    missing = sorted(need - {canonicalize_name(n) for n, _ in pins})
    if missing:
        raise Fail(
            f"{what} lacks {len(missing)} of the wheel's requirements on the target, "
            f"so it cannot stand for what ships: {', '.join(missing)}"
        )


# --- the audit ---------------------------------------------------------------------


def _listed(items: list[str], limit: int = 20) -> str:
    """`items` one an indented line, the first `limit`, then how many were left out."""
    more = [f"... and {len(items) - limit} more"] if len(items) > limit else []
    return "\n  ".join([*items[:limit], *more])


def _sources(service: str, osv_url: str | None) -> tuple[str, str]:
    """How the advisory source is named in messages, and the other one to try."""
    if service == "pypi":
        return "pypi (PyPI's per-release JSON API)", "--service osv"
    if osv_url:
        return f"osv at {osv_url}", "--service pypi, or OSV's own API (no --osv-url)"
    return "osv (OSV's API)", "--service pypi"


def _why_not(stderr: str) -> str:
    """Why pip-audit could not query its service, from its traceback: the
    requests error it ends in (unreachable, an HTTP status) or its last line."""
    errors = re.findall(r"^requests\.exceptions\.(\w+): (.*)$", stderr, re.M)
    for kind, text in errors:
        if kind == "HTTPError":
            status = re.match(r"(\d{3}) [^:]*: (.*?) for url", text)
            return f"it answers HTTP {status.group(1)} {status.group(2)}" if status else text
    for kind, text in errors:
        if kind in ("ConnectionError", "ConnectTimeout", "ReadTimeout", "ProxyError", "SSLError"):
            reason = re.search(r"\[Errno -?\d+\] ([^\"')]+)", text)
            return f"unreachable: {reason.group(1) if reason else kind}"
    return (stderr.strip().splitlines() or ["no output"])[-1]


def check_skipped(report: dict, pins: list[tuple[str, str]], service: str, osv_url: str | None):
    """Fail unless pip-audit audited every project: a source that knows none of
    them is named as such, in one line; otherwise the projects it skipped."""
    source, other = _sources(service, osv_url)
    skipped = [d for d in report["dependencies"] if "skip_reason" in d]
    if not skipped:
        return
    if len(skipped) == len(pins) and all("not found" in d["skip_reason"] for d in skipped):
        raise Fail(
            f"the advisory source {source} answered 'not found' for all {len(pins)} projects, "
            f"so it is not usable from here (a proxy or mirror without it?) and nothing "
            f"was written; the other source: {other}"
        )
    raise Fail(
        f"{len(skipped)} of {len(pins)} projects could not be audited against {source}, "
        f"so no report was written (the other source: {other}):\n  "
        + _listed([f"{d['name']}: {d['skip_reason']}" for d in skipped])
    )


def audit(pins: list[tuple[str, str]], service: str, osv_url: str | None) -> dict:
    """pip-audit's JSON report for `pins`; Fail if any project was not audited."""
    if importlib.util.find_spec("pip_audit") is None:
        raise Fail(f"pip-audit is not installed in {sys.prefix}: ./build.sh installs it")
    source, other = _sources(service, osv_url)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "pinned.txt"
        req.write_text("".join(f"{n}=={v}\n" for n, v in pins))
        out = Path(tmp) / "audit.json"
        cmd = [
            sys.executable,
            "-m",
            "pip_audit",
            "--no-deps",
            "--disable-pip",
            "--progress-spinner",
            "off",
            "-r",
            str(req),
            "-f",
            "json",
            "-o",
            str(out),
            "-s",
            service,
        ]
        if osv_url:
            cmd += ["--osv-url", osv_url]
        proc = subprocess.run(cmd, text=True, capture_output=True)
        if not out.exists():
            raise Fail(
                f"the advisory source {source} could not be queried ({_why_not(proc.stderr)}), "
                f"so nothing was audited and nothing written; the other source: {other}"
            )
        report = json.loads(out.read_text())
    check_skipped(report, pins, service, osv_url)
    asked = {canonicalize_name(n) for n, _ in pins}
    got = {canonicalize_name(d["name"]) for d in report["dependencies"]}
    if got != asked:
        raise Fail(f"pip-audit reported on {sorted(got ^ asked)} unlike what was asked")
    report["source"] = {"service": service, "url": osv_url}
    return report


def vex(report: dict, bom_path: Path, line: Line) -> str:
    """CycloneDX VEX for the report's advisories, linked to the SBOM at `bom_path`."""
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.impact_analysis import (
        ImpactAnalysisJustification,
        ImpactAnalysisState,
    )
    from cyclonedx.model.vulnerability import (
        BomTarget,
        Vulnerability,
        VulnerabilityAnalysis,
        VulnerabilityReference,
        VulnerabilitySource,
    )
    from packageurl import PackageURL

    from tpfix.release import sbom

    doc = json.loads(bom_path.read_text())
    serial = doc["serialNumber"].removeprefix("urn:uuid:")
    root = doc["metadata"]["component"]
    # The SBOM's own components, by canonical name and version (a requirement
    # component of the wheel's SBOM has no version: by name).
    refs: dict[tuple[str, str | None], str] = {}
    for c in [root, *doc.get("components", [])]:
        key = (canonicalize_name(c["name"]), c.get("version"))
        refs.setdefault(key, c["bom-ref"])
        refs.setdefault((key[0], None), c["bom-ref"])
    if root["name"] == "vllm":  # a wheel's SBOM: audited as its public version
        refs[("vllm", None)] = root["bom-ref"]
    triage_file, triage = load_triage(line)
    bom = Bom(serial_number=uuid.uuid4())
    bom.metadata.timestamp = datetime.now(UTC)
    bom.metadata.component = Component(
        type=ComponentType.CONTAINER if root["type"] == "container" else ComponentType.LIBRARY,
        name=root["name"],
        version=root.get("version"),
        bom_ref=f"urn:cdx:{serial}/1#{root['bom-ref']}",
        external_references=[
            ExternalReference(type=ExternalReferenceType.BOM, url=XsUri(bom_path.name))
        ],
    )
    source = VulnerabilitySource(name=report["source"]["url"] or report["source"]["service"])
    own: dict[str, Component] = {}
    for dep in report["dependencies"]:
        name = canonicalize_name(dep["name"])
        ref = refs.get((name, dep["version"])) or refs.get((name, None))
        if ref is not None:
            target = f"urn:cdx:{serial}/1#{ref}"
        else:  # resolved, not declared: described here
            target = f"pkg:pypi/{name}@{dep['version']}"
            if dep.get("vulns") and target not in own:
                own[target] = Component(
                    type=ComponentType.LIBRARY,
                    name=name,
                    version=dep["version"],
                    purl=PackageURL("pypi", name=name, version=dep["version"]),
                    bom_ref=target,
                )
        for v in dep.get("vulns", []):
            ids = [v["id"], *v.get("aliases", [])]
            entry = next((triage[i] for i in ids if i in triage), None)
            if entry is None:
                analysis = VulnerabilityAnalysis(
                    state=ImpactAnalysisState.IN_TRIAGE,
                    detail=f"not triaged yet: add it to {shown(triage_file)}",
                )
            else:
                detail = entry.get("detail", "")
                if entry.get("patch"):
                    detail = f"fixed by {entry['patch']} of the series. {detail}".strip()
                just = entry.get("justification")
                analysis = VulnerabilityAnalysis(
                    state=ImpactAnalysisState(entry["state"]),
                    justification=ImpactAnalysisJustification(just) if just else None,
                    detail=detail,
                )
            bom.vulnerabilities.add(
                Vulnerability(
                    bom_ref=f"{v['id']}:{name}@{dep['version']}",
                    id=v["id"],
                    source=source,
                    references=[
                        VulnerabilityReference(id=a, source=VulnerabilitySource(name="alias"))
                        for a in v.get("aliases", [])
                    ],
                    description=v.get("description"),
                    recommendation="fixed in " + ", ".join(v["fix_versions"])
                    if v.get("fix_versions")
                    else None,
                    analysis=analysis,
                    affects=[BomTarget(ref=target)],
                )
            )
    for c in own.values():
        bom.components.add(c)
    return sbom.dumps(bom)


def write_report(
    dist: Path, bom_path: Path, report: dict, vex_text: str, signer=None
) -> list[Path]:
    """Both files beside the SBOM (atomically, each), then SHA256SUMS with them."""
    stem = bom_path.name.removesuffix(".cdx.json")
    folder = bom_path.parent.relative_to(dist)
    files = {
        folder / f"{stem}.advisories.json": json.dumps(report, indent=2, sort_keys=True) + "\n",
        folder / f"{stem}.vex.cdx.json": vex_text,
    }
    return add_to_dist(dist, files, signer=signer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dist_step_args(ap)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--requirements", type=Path, help="audit this pinned set (name==version)")
    what.add_argument("--image", type=Path, help="audit the environment an image's SBOM lists")
    ap.add_argument("--service", default="pypi", choices=["pypi", "osv"])
    ap.add_argument("--osv-url", help="an OSV-compatible API (with --service osv)")
    args = ap.parse_args()
    # the dist folder checked signable before the audit: its report goes into it
    with dist_step(args, "audit another folder: --dist DIR") as (line, dist, signer):
        wheel, _ = find_wheel(dist, args.arch)
        arch = wheel_arch(wheel)
        tgt = target(line, arch)
        bom_path = dist / f"{wheel.name}.cdx.json"
        if args.image:
            bom_path = args.image.resolve()
            if not bom_path.is_relative_to(dist):
                raise Fail(f"{args.image} is not in {dist}: the report goes beside it")
            pins, how = image_pins(bom_path), f"the image's SBOM {bom_path.name}"
        elif args.requirements:
            digest = sha256(args.requirements.read_bytes()).hexdigest()
            pins = read_requirements(args.requirements)
            how = f"--requirements {args.requirements.name} (sha256 {digest})"
        else:
            pins = resolve(wheel, tgt, args.index_url)
            how = f"uv pip compile for Python {tgt['python']} on {tgt['platform']}"
        check_covers(pins, needed(wheel, tgt["env"]), how)
        pins = public(pins)
        print(
            f"auditing {len(pins)} projects ({how}) against {args.osv_url or args.service}",
            file=sys.stderr,
        )
        report = audit(pins, args.service, args.osv_url)
        report["tpfix"] = {
            "set": how,
            "projects": len(pins),
            "local versions": "audited as their public version",
            "extras": "not audited",
            "pip-audit": metadata.version("pip-audit"),
            "audited at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        for path in write_report(dist, bom_path, report, vex(report, bom_path, line), signer):
            print(path)
        found = sum(len(d.get("vulns", [])) for d in report["dependencies"])
        print(f"{found} known advisories in {len(pins)} projects", file=sys.stderr)


if __name__ == "__main__":
    main_wrapper(main)
