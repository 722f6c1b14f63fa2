# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The SBOMs (tpfix.release.wheel_sbom, tpfix.image.image_sbom, tpfix.release.sbom): the wheel's,
written by the package stage on the tiny wheel of tests/small_dist.py, the
image's on an inventory written here, and the schema check.  The image's
SBOM on a real image: tests/test_image.py.

Fast tier: the schema check.  Slow tier: every package stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sbom_checks import check_wheel_sbom, defect, minimum_elements
from small_dist import publish_small, sha

from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.core.util import Fail
from tpfix.core.wheelfile import parse_metadata, requirements
from tpfix.image import image_sbom
from tpfix.release import sbom, wheel_sbom


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_sbom_names_the_upstream_inputs_and_each_patch(tmp_path: Path):
    dist, wheel, sdist, official = publish_small(tmp_path)
    doc = check_wheel_sbom(dist / f"{wheel.name}.cdx.json", wheel, sha(sdist), sha(official))
    (comp,) = doc["components"]  # the tiny wheel's one requirement
    assert comp["name"] == "flashinfer-python" and comp["scope"] == "required"
    assert comp["version"] == "0.6.16.post4"
    assert comp["purl"] == "pkg:pypi/flashinfer-python@0.6.16.post4"
    (dep,) = [d for d in doc["dependencies"] if d["ref"] == doc["metadata"]["component"]["bom-ref"]]
    assert dep["dependsOn"] == [comp["bom-ref"]]
    # what it holds and what not: declared requirements only, said to people and tools
    root = doc["metadata"]["component"]["bom-ref"]
    assert doc["compositions"] == [
        {"aggregate": "incomplete_first_party_only", "assemblies": [root], "dependencies": [root]}
    ]
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props["tpfix:inventory"].startswith("declared, not resolved")


def _props(c) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in c.properties:
        out.setdefault(p.name, []).append(p.value)
    return out


def test_each_required_project_is_one_component_with_purl_and_vers_range():
    """As vLLM's own METADATA writes them: a name twice (a base requirement
    and an extra's), non-canonical names, a bare name, wildcard exclusions."""
    listed = [
        "opentelemetry-sdk>=1.27.0",
        'opentelemetry-sdk>=1.26.0; extra == "otel"',
        "opentelemetry-sdk>=1.27.0",
        "prometheus_client>=0.18.0",
        "regex",
        "PyNvVideoCodec==2.0.4",
        "fastapi[standard]<0.137.0,>=0.133.0",
        "protobuf!=6.30.*,!=6.31.*,>=5.29.6",
        'scipy; extra == "bench"',
        'scipy; extra == "audio"',
    ]
    meta = parse_metadata("".join(f"Requires-Dist: {r}\n" for r in listed))
    comps = wheel_sbom.requirement_components(requirements(meta))
    by = {c.name: c for c in comps}
    assert sorted(by) == [
        "fastapi",
        "opentelemetry-sdk",
        "prometheus-client",
        "protobuf",
        "pynvvideocodec",
        "regex",
        "scipy",
    ]
    assert len({c.bom_ref.value for c in comps}) == len(comps)
    otel = _props(by["opentelemetry-sdk"])
    assert otel["tpfix:requirement"] == [
        'opentelemetry-sdk>=1.26.0; extra == "otel"',
        "opentelemetry-sdk>=1.27.0",
    ]
    assert otel["tpfix:version-range"] == ["vers:pypi/>=1.26.0", "vers:pypi/>=1.27.0"]
    assert otel["tpfix:marker"] == ['extra == "otel"']
    assert by["opentelemetry-sdk"].scope.value == "required"
    assert by["scipy"].scope.value == "optional"  # only our extras need it
    assert str(by["pynvvideocodec"].purl) == "pkg:pypi/pynvvideocodec@2.0.4"
    assert by["pynvvideocodec"].version == "2.0.4"
    assert str(by["fastapi"].purl) == "pkg:pypi/fastapi" and by["fastapi"].version is None
    assert _props(by["fastapi"])["tpfix:version-range"] == ["vers:pypi/>=0.133.0|<0.137.0"]
    assert _props(by["regex"])["tpfix:version-range"] == ["vers:pypi/*"]
    assert _props(by["protobuf"])["tpfix:version-range"] == ["vers:pypi/>=5.29.6|<6.30|>=6.32"]


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (">=1.2,<2", "vers:pypi/>=1.2|<2"),
        ("==1.0", "vers:pypi/1.0"),
        ("~=1.4.2", "vers:pypi/>=1.4.2|<1.5"),
        (">=1,!=1.5,<2", "vers:pypi/>=1|!=1.5|<2"),
        ("==1.2.*", "vers:pypi/>=1.2|<1.3"),
        ("!=1.*", "vers:pypi/<1|>=2"),
        (">1,<=3", "vers:pypi/>1|<=3"),
        ("", "vers:pypi/*"),
        (">3,<2", None),  # allows nothing: no range claimed
    ],
)
def test_pep440_specifiers_in_vers_form(spec: str, want: str | None):
    from packaging.specifiers import SpecifierSet

    assert wheel_sbom.vers(SpecifierSet(spec)) == want


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"Forwarded": "not-needed", "Applied-Upstream": "v0.33.0 (a newer pin)"}, "superseded"),
        (
            {"Forwarded": "https://github.com/vllm-project/vllm/pull/1", "Applied-Upstream": "v1"},
            "applied",
        ),
        ({"Forwarded": "https://github.com/vllm-project/vllm/pull/1"}, "open"),
        ({"Forwarded": "no"}, "open"),
        ({}, "open"),
    ],
)
def test_what_upstream_did_with_a_patch_follows_its_header(fields: dict, status: str):
    got, reason = wheel_sbom.upstream_status(fields, None)
    assert got == status
    if status == "open" and "Forwarded" in fields and fields["Forwarded"] != "no":
        assert reason == f"forwarded as {fields['Forwarded']}"
    _, with_rebase = wheel_sbom.upstream_status(fields, "rebased from v0.27.1: conflicts")
    assert with_rebase == f"{reason}; rebased from v0.27.1: conflicts"


def test_sbom_schema_check_rejects_a_broken_document():
    with pytest.raises(Fail, match="not valid CycloneDX 1.6"):
        sbom.validate(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": "x"}))


def _image_sbom(tmp_path: Path) -> tuple[dict, str]:
    """The image's SBOM (image_sbom.image_bom, the real code) on an inventory written
    here, around the package stage's wheel component; and that component's ref."""
    dist, wheel, sdist, official = publish_small(tmp_path, get_line().version)
    inventory = {
        "base": {"name": "vllm/vllm-openai:v0.27.1", "digest": "sha256:" + "1" * 64},
        "image": {"ref": "localhost/x:1", "config_digest": "sha256:" + "2" * 64, "layers": []},
        "python": [
            {
                "name": "vllm",
                "version": get_line().version,
                "location": "/usr/lib",
            },
            {"name": "Jinja2", "version": "3.1.6", "location": "/usr/lib"},
        ],
    }
    comp = wheel_sbom.wheel_component(wheel, BuildContext.resolve(get_line()), sdist, official)
    bom = image_sbom.image_bom(inventory, comp, 1, get_line().version, "v0.27.1", "x-1")
    return json.loads(sbom.dumps(bom)), comp.bom_ref.value


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_image_sbom_has_the_minimum_elements(tmp_path: Path):
    doc, wheel_ref = _image_sbom(tmp_path)
    assert minimum_elements(doc, {wheel_ref}) == []
    root = doc["metadata"]["component"]
    assert root["type"] == "container" and root["supplier"]["name"] == sbom.DISTRIBUTION
    assert "externalReferences" not in root  # no VEX link: the build writes none
    (ours,) = [c for c in doc["components"] if c["bom-ref"] == wheel_ref]
    names = read_series(get_line().series)
    assert [defect(p)["description"].split(" ", 1)[0] for p in ours["pedigree"]["patches"]] == (
        names
    )
    (tool,) = [t for t in doc["metadata"]["tools"]["components"] if t["name"] == "vllm-tpfix-tools"]
    assert tool["version"] == get_line().version


@pytest.mark.slow  # two package stages (about a second each): not while editing a patch
def test_sboms_of_two_builds_are_byte_identical(tmp_path: Path):
    a, wa, _, _ = publish_small(tmp_path / "a")
    b, wb, _, _ = publish_small(tmp_path / "b")
    assert (a / f"{wa.name}.cdx.json").read_bytes() == (b / f"{wb.name}.cdx.json").read_bytes()
    assert _image_sbom(tmp_path / "c") == _image_sbom(tmp_path / "d")


def test_the_minimum_elements_check_names_what_is_missing():
    """The checker itself, on an SBOM that has none of them (it can fail)."""
    bare = {
        "metadata": {
            "tools": {"components": [{"name": "x"}]},
            "component": {"bom-ref": "root", "name": "vllm", "type": "library"},
        },
        "components": [{"bom-ref": "dep", "name": "dep", "type": "library"}],
    }
    assert minimum_elements(bare, {"root"}) == [
        "metadata: no author of the SBOM data (authors or manufacturer)",
        "metadata: no timestamp and no stated absence (tpfix:timestamp)",
        "tool 'x': no name or version",
        "component root: no supplier, and none stated unknown",
        "component root: no version or version range",
        "component root: no unique identifier (purl)",
        "component root: a file we ship, without a SHA-256 hash",
        "component root: a file we ship, without a license",
        "component dep: no supplier, and none stated unknown",
        "component dep: no version or version range",
        "component dep: no unique identifier (purl)",
        "component dep: no dependency relationship to the subject",
        "the subject: no supplier",
        "the subject: no authors or manufacturer",
    ]
