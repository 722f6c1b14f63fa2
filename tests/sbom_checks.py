# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Checks of our SBOMs shared by the tests of the SBOM, the package stage and
the image: the wheel's SBOM against the line it was built from, and NTIA's
minimum elements and CISA's baseline attributes on any CycloneDX document."""

from __future__ import annotations

import json
from pathlib import Path

from small_dist import sha

from tpfix.core.lines import get_line, read_version
from tpfix.core.patch_format import read_patch, read_series
from tpfix.release import sbom


def defect(patch: dict) -> dict:
    (issue,) = [i for i in patch["resolves"] if i["type"] == "defect"]
    return issue


def check_wheel_sbom(doc_path: Path, wheel: Path, sdist_sha: str, official_sha: str) -> dict:
    """The default line's wheel SBOM at `doc_path`: schema-valid, its subject
    the wheel, the minimum elements, the pinned inputs as ancestors, each
    patch in series order with the upstream issue and status its header
    gives; returns the document."""
    text = doc_path.read_text()
    sbom.validate(text)  # the CycloneDX 1.6 JSON schema, strict
    doc = json.loads(text)
    root = doc["metadata"]["component"]
    assert root["name"] == "vllm"
    assert root["version"] == wheel.name.split("-")[1]
    assert root["hashes"] == [{"alg": "SHA-256", "content": sha(wheel)}]
    assert minimum_elements(doc, {root["bom-ref"]}) == []
    ancestors = {a["bom-ref"].split(":")[1]: a for a in root["pedigree"]["ancestors"]}
    assert ancestors["sdist"]["hashes"][0]["content"] == sdist_sha
    assert ancestors["wheel"]["hashes"][0]["content"] == official_sha
    for a in ancestors.values():
        assert a["supplier"]["name"] == sbom.UPSTREAM
    assert root["supplier"]["name"] == doc["metadata"]["authors"][0]["name"] == sbom.DISTRIBUTION
    line = get_line()
    names = read_series(line.series)
    patches = root["pedigree"]["patches"]
    # in series order, each naming its file, place and sha256
    for pos, (name, p) in enumerate(zip(names, patches, strict=True), 1):
        issue = defect(p)
        assert issue["description"].startswith(
            f"{name} (sha256 {sha(line.patches / name)}), patch {pos} of {len(names)} "
            "in series order; upstream: "
        )
        assert p["diff"]["text"]["content"] == (line.patches / name).read_text()
        # the upstream issue the header's Bug: names, by id and link; a patch
        # whose issue is still to be filed (Issue:) or that only relates to
        # one (Related:) is named by its file
        bugs = [v for k, v in trailers(line.patches / name) if k == "Bug"]
        if bugs:
            (bug,) = bugs
            owner_repo, num = bug.removeprefix("https://github.com/").split("/issues/")
            assert issue["id"] == f"{owner_repo}#{num}"
            assert issue["source"]["url"] == bug and bug in issue["references"]
        else:
            bug = None
            assert issue["id"] == f"tpfix:{name}" and "source" not in issue, issue
        # Related: references, as links (vllm#N: the pull request)
        refs = [r for r in issue["references"] if r != bug]
        assert all(r.startswith("https://github.com/") for r in refs), refs
        header = dict(trailers(line.patches / name))
        if header.get("Applied-Upstream") and header.get("Forwarded") in ("no", "not-needed"):
            assert "upstream: superseded: fixed in " in issue["description"]
        elif not header.get("Applied-Upstream"):
            assert "upstream: open: not forwarded" in issue["description"]
        assert p["type"] == "unofficial"  # no patch of ours is upstream's own change
    expected = []
    for name in names:  # by patch: superseded where upstream fixed it, else open
        header = dict(trailers(line.patches / name))
        fixed = header.get("Applied-Upstream") and header.get("Forwarded") in ("no", "not-needed")
        expected.append(f"{name.split('-', 1)[0]} {'superseded' if fixed else 'open'}")
    assert f"Upstream, by patch: {'; '.join(expected)}." in root["pedigree"]["notes"]
    # no link to a file the build does not write
    assert all(e["type"] != "exploitability-statement" for e in root["externalReferences"])
    assert "timestamp" not in doc["metadata"]
    (tool,) = [t for t in doc["metadata"]["tools"]["components"] if t["name"] == "vllm-tpfix-tools"]
    assert tool["version"] == read_version(line.version_file)
    return doc


def trailers(path: Path):
    return read_patch(path).header.trailers


# --- NTIA minimum elements and CISA's baseline attributes ---------------------------


def minimum_elements(doc: dict, shipped: set[str]) -> list[str]:
    """What a CycloneDX JSON SBOM lacks of NTIA's minimum elements (2021) and
    CISA's baseline attributes (2024), one finding a line; [] when none.

    Every component (the subject, the listed components, the subject's
    pedigree ancestors): a name; a supplier, or the statement that it is not
    known (property tpfix:supplier); a version, or the range a requirement
    allows (property tpfix:version-range); an identifier (purl; a container
    by its digest); reachable from the subject in `dependencies`.  Those in
    `shipped` (bom-refs of the files we ship) also a SHA-256 hash and a
    license.  The SBOM: an author, a timestamp or a stated absence (metadata
    property tpfix:timestamp), each tool with a name and a version."""
    out = []
    meta = doc.get("metadata", {})
    props = {p["name"]: p.get("value") for p in meta.get("properties", [])}
    if not any(a.get("name") for a in meta.get("authors", [])) and not (
        meta.get("manufacturer", {}).get("name")
    ):
        out.append("metadata: no author of the SBOM data (authors or manufacturer)")
    if not meta.get("timestamp") and not props.get("tpfix:timestamp"):
        out.append("metadata: no timestamp and no stated absence (tpfix:timestamp)")
    tools = meta.get("tools", {}).get("components", [])
    if not tools:
        out.append("metadata: no tool")
    for t in tools:
        if not t.get("name") or not t.get("version"):
            out.append(f"tool {t.get('name')!r}: no name or version")
    root = meta.get("component")
    if root is None:
        return [*out, "metadata: no component (the subject)"]
    comps = [root, *doc.get("components", [])]
    ancestors = root.get("pedigree", {}).get("ancestors", [])
    graph = {d["ref"]: d.get("dependsOn", []) for d in doc.get("dependencies", [])}
    reached, todo = set(), [root["bom-ref"]]
    while todo:
        ref = todo.pop()
        if ref not in reached:
            reached.add(ref)
            todo += graph.get(ref, [])
    for c in [*comps, *ancestors]:
        what = f"component {c.get('bom-ref') or c.get('name')}"
        cprops = {p["name"] for p in c.get("properties", []) if p.get("value")}
        if not c.get("name"):
            out.append(f"{what}: no name")
        if not c.get("supplier", {}).get("name") and "tpfix:supplier" not in cprops:
            out.append(f"{what}: no supplier, and none stated unknown")
        if not c.get("version") and "tpfix:version-range" not in cprops:
            out.append(f"{what}: no version or version range")
        if not c.get("purl") and not (c.get("type") == "container" and c.get("hashes")):
            out.append(f"{what}: no unique identifier (purl)")
        if c in comps and c["bom-ref"] not in reached:
            out.append(f"{what}: no dependency relationship to the subject")
        if c.get("bom-ref") in shipped:
            if not any(h.get("alg") == "SHA-256" for h in c.get("hashes", [])):
                out.append(f"{what}: a file we ship, without a SHA-256 hash")
            if not c.get("licenses"):
                out.append(f"{what}: a file we ship, without a license")
    if not root.get("supplier", {}).get("name"):
        out.append("the subject: no supplier")
    if not root.get("authors") and not root.get("manufacturer", {}).get("name"):
        out.append("the subject: no authors or manufacturer")
    return out
