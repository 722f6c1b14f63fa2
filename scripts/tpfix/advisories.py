# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Known advisories for what a built wheel ships, and our VEX on each (pip-audit).

    python -m tpfix.advisories                  # the default line's dist/
    python -m tpfix.advisories --line v0.33.0   # dist/v0.33.0/
    python -m tpfix.advisories --requirements PINNED.txt   # a given pinned set
    python -m tpfix.advisories --image dist/image/NAME.cdx.json   # an image's environment
    python -m tpfix.advisories --service osv [--osv-url URL]

1. The dependency set: pip resolves the wheel's requirements as its users
   get them (the image's Python and platform, binary wheels only; pip's
   `--dry-run --report`), or `--requirements` gives it pinned, or `--image`
   takes every Python distribution the image's SBOM lists.  vLLM itself
   is audited as its upstream version: scanners read 0.27.1+tpfix.3 as
   0.27.1, so its advisories are ours unless the series fixes them.
2. pip-audit checks each pinned project against the advisory service (the
   package index's advisory data by default, `-s pypi`; OSV with --service).
3. Written into the dist folder, listed in SHA256SUMS:
     <wheel>.advisories.json   pip-audit's report, with the source and the set
     <wheel>.vex.cdx.json      CycloneDX VEX: each advisory, the component it
                               affects (BOM-Link into <wheel>.cdx.json) and
                               our analysis from the line's advisories.toml
   An advisory advisories.toml does not name is `in_triage`.  With --image,
   both are named after the image's SBOM, in dist/image/.

Advisory data changes every day while the wheel does not, so this is a
separate step, not part of ./build.sh: the SBOM stays reproducible and a
build does not depend on a service being up.  If the source cannot be
reached, or a single project could not be audited, the command says so and
exits non-zero, writing nothing: it never reports "no advisories" for what
it did not check.

advisories.toml (beside the line's series; optional):
    [[advisory]]
    id = "GHSA-..."            # or a PYSEC/CVE id: matched against aliases too
    state = "resolved"         # CycloneDX: resolved, not_affected, exploitable,
                               #   false_positive, in_triage, resolved_with_pedigree
    justification = "..."      # not_affected: code_not_present, code_not_reachable, ...
    patch = "0002-....patch"   # resolved: the patch of the series that fixes it
    detail = "..."
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
import uuid
from pathlib import Path

from tpfix.common import Fail, Line, get_line, line_names, main_wrapper, shown
from tpfix.package import find_wheel, listed, write_sums
from tpfix.worklock import dist_lock

STATES = {
    "resolved",
    "resolved_with_pedigree",
    "exploitable",
    "in_triage",
    "false_positive",
    "not_affected",
}
# The platform pip resolves for: the official image's (Python 3.12, manylinux).
PYTHON = "3.12"
_GLIBC = ["2_28", "2_27", "2_26", "2_25", "2_24", "2_17", "2_12", "2_5"]


def platforms(arch: str) -> list[str]:
    """Every manylinux tag a manylinux_2_28 machine accepts (pip takes them literally)."""
    return [f"manylinux_{g}_{arch}" for g in _GLIBC] + [
        f"manylinux2014_{arch}",
        f"manylinux1_{arch}" if arch == "x86_64" else f"linux_{arch}",
    ]


def resolve(wheel: Path) -> list[tuple[str, str]]:
    """(name, version) of everything pip installs with `wheel` on the image's Python."""
    arch = "aarch64" if "aarch64" in wheel.name else "x86_64"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "--only-binary=:all:",
            "--python-version",
            PYTHON,
            "--target",
            str(Path(tmp) / "t"),
        ]
        cmd += [a for p in platforms(arch) for a in ("--platform", p)]
        proc = subprocess.run([*cmd, str(wheel)], text=True, capture_output=True)
        if proc.returncode != 0 or not report.exists():
            errs = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
            raise Fail(
                f"pip could not resolve the requirements of {wheel.name} for Python "
                f"{PYTHON} on {arch} from the configured index, so they cannot be "
                "audited:\n  "
                + "\n  ".join(errs or proc.stderr.strip().splitlines()[-5:])
                + "\n  (give the set pinned with --requirements FILE)"
            )
        items = json.loads(report.read_text())["install"]
    return sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in items)


def as_upstream(pins: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pins with vllm at its public version (what scanners read ours as)."""
    return [(n, v.split("+")[0] if n.lower() == "vllm" else v) for n, v in pins]


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


def audit(pins: list[tuple[str, str]], service: str, osv_url: str | None) -> dict:
    """pip-audit's JSON report for `pins`; Fail if any project was not audited."""
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
        source = osv_url or service
        if not out.exists():
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise Fail(
                f"the advisory source ({source}) could not be queried, so nothing was "
                f"audited and nothing written: {last}"
            )
        report = json.loads(out.read_text())
    skipped = [d for d in report["dependencies"] if "skip_reason" in d]
    if skipped:
        shown_ = "\n  ".join(f"{d['name']}: {d['skip_reason']}" for d in skipped[:20])
        raise Fail(
            f"{len(skipped)} of {len(pins)} projects could not be audited against "
            f"{source}, so no report was written:\n  {shown_}"
        )
    report["source"] = {"service": service, "url": osv_url}
    return report


def load_triage(line: Line) -> tuple[Path, dict[str, dict]]:
    path = line.series.parent / "advisories.toml"
    if not path.exists():
        return path, {}
    entries = tomllib.loads(path.read_text()).get("advisory", [])
    series = set(line.series.read_text().split())
    out = {}
    for e in entries:
        if e.get("state") not in STATES:
            raise Fail(f"{shown(path)}: {e.get('id')}: state must be one of {sorted(STATES)}")
        if e["state"] == "resolved" and e.get("patch") not in series:
            raise Fail(
                f"{shown(path)}: {e['id']}: resolved needs `patch` naming a patch of the series"
            )
        out[e["id"]] = e
    return path, out


def image_pins(bom_path: Path) -> list[tuple[str, str]]:
    """The Python distributions an image's SBOM lists (tpfix.sbom.image_bom)."""
    doc = json.loads(bom_path.read_text())
    return sorted(
        (c["name"], c["version"])
        for c in doc.get("components", [])
        if c.get("purl", "").startswith("pkg:pypi/") and c.get("version")
    )


def vex(report: dict, bom_path: Path, line: Line) -> str:
    """CycloneDX VEX for the report's advisories, linked to the SBOM at `bom_path`."""
    from cyclonedx.model.bom import Bom
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

    from tpfix import sbom

    sbom_doc = json.loads(bom_path.read_text())
    serial = sbom_doc["serialNumber"].removeprefix("urn:uuid:")
    root_ref = sbom_doc["metadata"]["component"]["bom-ref"]
    refs = {c["name"].lower(): c["bom-ref"] for c in sbom_doc.get("components", [])}
    if sbom_doc["metadata"]["component"]["name"] == "vllm":  # a wheel's: vllm is the root
        refs["vllm"] = root_ref
    triage_file, triage = load_triage(line)
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"tpfix:vex:{serial}"))
    for dep in report["dependencies"]:
        name = dep["name"].lower()
        ref = refs.get(name, f"pkg:pypi/{name}@{dep['version']}")
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
                analysis = VulnerabilityAnalysis(
                    state=ImpactAnalysisState(entry["state"]),
                    justification=ImpactAnalysisJustification(entry["justification"])
                    if entry.get("justification")
                    else None,
                    detail=detail,
                )
            bom.vulnerabilities.add(
                Vulnerability(
                    bom_ref=f"{v['id']}:{name}",
                    id=v["id"],
                    source=VulnerabilitySource(
                        name=report["source"]["url"] or report["source"]["service"]
                    ),
                    references=[
                        VulnerabilityReference(id=a, source=VulnerabilitySource(name="alias"))
                        for a in v.get("aliases", [])
                    ],
                    description=v.get("description"),
                    recommendation=(
                        "fixed in " + ", ".join(v["fix_versions"])
                        if v.get("fix_versions")
                        else None
                    ),
                    analysis=analysis,
                    affects=[BomTarget(ref=f"urn:cdx:{serial}/1#{ref}")],
                )
            )
    return sbom.dumps(bom)


def write_report(dist: Path, bom_path: Path, report: dict, vex_text: str) -> list[Path]:
    """Both files beside the SBOM (atomically, each), then SHA256SUMS with them."""
    stem = bom_path.name.removesuffix(".cdx.json")
    folder = bom_path.parent.relative_to(dist)
    files = {
        folder / f"{stem}.advisories.json": json.dumps(report, indent=2, sort_keys=True) + "\n",
        folder / f"{stem}.vex.cdx.json": vex_text,
    }
    for rel, text in files.items():
        tmp = dist / rel.parent / f".{rel.name}.tmp"
        tmp.write_text(text)
        tmp.replace(dist / rel)
    kept = [p for p in listed(dist) if p not in files]
    write_sums(dist, [*kept, *files])
    return [dist / rel for rel in files]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--line", choices=line_names(), help="release line (default: VERSION's)")
    ap.add_argument("--dist", type=Path, help="default dist/ (dist/TAG/ for another line)")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--requirements", type=Path, help="audit this pinned set (name==version)")
    what.add_argument("--image", type=Path, help="audit the environment an image's SBOM lists")
    ap.add_argument("--service", default="pypi", choices=["pypi", "osv"])
    ap.add_argument("--osv-url", help="an OSV-compatible API (with --service osv)")
    args = ap.parse_args()
    line = get_line(args.line)
    dist = args.dist or line.dist
    with dist_lock(dist, "audit another folder: --dist DIR"):
        wheel, _ = find_wheel(dist)
        bom_path = (dist / f"{wheel.name}.cdx.json").resolve()
        if args.image:
            bom_path = args.image.resolve()
            if not bom_path.is_relative_to(dist.resolve()):
                raise Fail(f"{args.image} is not in {dist}: the report goes beside it")
            pins = image_pins(bom_path)
        elif args.requirements:
            pins = read_requirements(args.requirements)
        else:
            pins = resolve(wheel)
        pins = as_upstream(pins)
        print(
            f"auditing {len(pins)} projects against {args.osv_url or args.service}", file=sys.stderr
        )
        report = audit(pins, args.service, args.osv_url)
        for path in write_report(dist.resolve(), bom_path, report, vex(report, bom_path, line)):
            print(path)
        found = sum(len(d.get("vulns", [])) for d in report["dependencies"])
        print(f"{found} known advisories in {len(pins)} projects", file=sys.stderr)


if __name__ == "__main__":
    main_wrapper(main)
