# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The SBOMs (tpfix.sbom): the wheel's, written by the package stage on the
tiny wheel of tests/test_release.py, and the schema check.  The image's SBOM
on a real image: tests/test_image.py.

Fast tier: the schema check.  Slow tier: every package stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_release import _publish_small, _sha

from tpfix import sbom
from tpfix.common import Fail, get_line
from tpfix.patchfile import read_series


def _check_sbom(doc_path: Path, wheel: Path, sdist_sha: str, official_sha: str) -> dict:
    text = doc_path.read_text()
    sbom.validate(text)  # the CycloneDX 1.6 JSON schema, strict
    doc = json.loads(text)
    root = doc["metadata"]["component"]
    assert root["name"] == "vllm"
    assert root["version"] == wheel.name.split("-")[1]
    assert root["hashes"] == [{"alg": "SHA-256", "content": _sha(wheel)}]
    ancestors = {a["bom-ref"].split(":")[1]: a for a in root["pedigree"]["ancestors"]}
    assert ancestors["sdist"]["hashes"][0]["content"] == sdist_sha
    assert ancestors["wheel"]["hashes"][0]["content"] == official_sha
    line = get_line()
    names = read_series(line.series)
    patches = root["pedigree"]["patches"]
    assert sorted(p["resolves"][0]["id"] for p in patches) == sorted(names)
    positions = {p["resolves"][0]["id"]: p["resolves"][0]["description"] for p in patches}
    for pos, name in enumerate(names, 1):  # the library sorts them: the place is written out
        assert f"patch {pos} of {len(names)} in series order" in positions[name]
    for p in patches:
        name = p["resolves"][0]["id"]
        assert p["diff"]["text"]["content"] == (line.patches / name).read_text()
        assert _sha(line.patches / name) in p["resolves"][0]["description"]
        bug = [v for k, v in _trailers(line.patches / name) if k == "Bug"][0]
        assert bug in p["resolves"][0]["references"]
        assert p["type"] == ("backport" if name.startswith("0001") else "unofficial")
    return doc


def _trailers(path: Path):
    from tpfix.patchfile import read_patch

    return read_patch(path).header.trailers


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_sbom_names_the_upstream_inputs_and_each_patch(tmp_path: Path):
    dist, wheel, sdist, official = _publish_small(tmp_path)
    doc = _check_sbom(dist / f"{wheel.name}.cdx.json", wheel, _sha(sdist), _sha(official))
    reqs = {c["properties"][0]["value"] for c in doc["components"]}
    assert reqs == {"flashinfer-python==0.6.16.post4"}  # the tiny wheel's one requirement
    (comp,) = doc["components"]
    assert comp["version"] == "0.6.16.post4" and comp["scope"] == "required"
    (dep,) = [d for d in doc["dependencies"] if d["ref"] == doc["metadata"]["component"]["bom-ref"]]
    assert dep["dependsOn"] == [comp["bom-ref"]]


def test_sbom_schema_check_rejects_a_broken_document():
    with pytest.raises(Fail, match="not valid CycloneDX 1.6"):
        sbom.validate(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": "x"}))
