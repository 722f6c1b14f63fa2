# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The resolved SBOM of the wheel on the reference platform (tpfix.audit.resolved_sbom).

The real uv resolves the tiny wheel of tests/small_dist.py from an index of
tiny wheels served on 127.0.0.1 (tpfix.release.index pages, with their PEP 658
.metadata files), as in tests/test_advisories.py; the command reads each
wheel's core metadata from there and writes the SBOM into the dist folder.

Fast tier: the license rules, the choice of a locked wheel and the dependency
graph.  Slow tier: the command, with servers and subprocesses.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cyclonedx.model.bom import Bom
from served import Served
from small_dist import check_sums, keypair, publish_small, sums
from wheels import make_wheel

from tpfix.audit import resolved_sbom
from tpfix.audit.resolution import pick_wheel
from tpfix.core.util import ROOT, Fail
from tpfix.core.wheelfile import parse_metadata, requirements
from tpfix.release import attest, sbom

TGT = {
    "python": "3.12",
    "platform": "x86_64-manylinux_2_35",
    "env": {
        "python_version": "3.12",
        "python_full_version": "3.12.0",
        "platform_machine": "x86_64",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    },
}


def _meta(*fields: str):
    return parse_metadata("Metadata-Version: 2.4\nName: x\nVersion: 1\n" + "\n".join(fields) + "\n")


def _licenses(*fields: str):
    found, source = resolved_sbom.licenses_of(_meta(*fields))
    return [(getattr(x, "value", None) or x.id or x.name) for x in found], source


def test_a_license_only_where_the_metadata_states_one():
    classifier = "Classifier: License :: OSI Approved :: BSD License"
    assert _licenses("License-Expression: MIT OR Apache-2.0", "License: GPL", classifier) == (
        ["MIT OR Apache-2.0"],
        "License-Expression",
    )
    assert _licenses("License: BSD-3-Clause", classifier) == (["BSD-3-Clause"], "License")
    assert _licenses("License: Apache 2.0") == (["Apache 2.0"], "License")  # a name, not an id
    # a license text in License is not a license name: the classifiers then
    text = "License: Copyright (c) 2020 Someone\n        Permission is hereby granted"
    assert _licenses(text, classifier) == (["BSD License"], "classifier")
    assert _licenses("License: UNKNOWN", "Classifier: License :: OSI Approved") == ([], None)
    # a classifier that names one SPDX license gives its id; others stay names
    mit = "Classifier: License :: OSI Approved :: MIT License"
    lgpl = "Classifier: License :: OSI Approved :: GNU Lesser General Public License v3 (LGPLv3)"
    found, source = resolved_sbom.licenses_of(_meta(text, mit, lgpl, classifier))
    assert [(x.id, x.name) for x in found] == [
        ("MIT", None),
        ("LGPL-3.0-only", None),
        (None, "BSD License"),
    ]
    assert source == "classifier"
    from cyclonedx import spdx

    assert [v for v in resolved_sbom.CLASSIFIER_SPDX.values() if not spdx.is_supported_id(v)] == []
    assert _licenses("Classifier: Programming Language :: Python") == ([], None)


def test_a_license_text_whose_first_line_names_the_license():
    """The METADATA of tiktoken and tokenspeed-mla: `License: MIT License`, then
    the whole text, and no classifier; the first line names the license (an
    SPDX id where it is one, or a classifier's name); a first line that names
    none (a copyright line) still gives none."""
    text = (
        "License: MIT License\n        \n        Copyright (c) 2022 OpenAI, Shantanu Jain\n"
        "        \n        Permission is hereby granted, free of charge, to any person"
    )
    found, source = resolved_sbom.licenses_of(_meta(text))
    assert [(x.id, x.name) for x in found] == [("MIT", None)] and source == "License, first line"
    bsd = "License: BSD 3-Clause License\n        \n        Copyright (c) 2024, Someone"
    assert _licenses(bsd) == (["BSD 3-Clause License"], "License, first line")
    assert _licenses("License: Apache-2.0\n        the text") == (
        ["Apache-2.0"],
        "License, first line",
    )
    copyright_only = "License: Copyright (c) 2020 Someone\n        Permission is hereby granted"
    assert _licenses(copyright_only) == ([], None)


def _locked(*names: str) -> dict:
    return {
        "name": "p",
        "version": "1",
        "wheels": [
            {"url": f"http://h/{n}", "hashes": {"sha256": str(i) * 64}} for i, n in enumerate(names)
        ],
    }


def test_the_locked_wheel_is_the_one_the_target_installs():
    p = _locked(
        "p-1-cp312-cp312-manylinux_2_17_aarch64.whl",
        "p-1-cp312-cp312-musllinux_1_2_x86_64.whl",
        "p-1-py3-none-any.whl",
        "p-1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "p-1-cp312-cp312-manylinux_2_39_x86_64.whl",  # newer than the image's glibc
    )
    assert (
        pick_wheel(p, TGT)["name"]
        == "p-1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    )
    with pytest.raises(Fail, match="none of its wheels installs on Python 3.12"):
        pick_wheel(_locked("p-1-cp311-cp311-manylinux_2_17_x86_64.whl"), TGT)


def test_the_graph_follows_markers_and_the_extras_asked_for():
    reqs = {
        "vllm": ["a", 'b; platform_machine == "aarch64"', "c; extra == 'audio'"],
        "a": ["c[fast]", "d; python_version < '3.12'"],
        "b": [],
        "c": ['d; extra == "fast"'],
        "d": [],
    }
    requires = {
        n: requirements(_meta(*(f"Requires-Dist: {r}" for r in rs))) for n, rs in reqs.items()
    }
    graph = resolved_sbom.dependency_graph(requires, TGT["env"], "vllm")
    assert graph == {"vllm": {"a"}, "a": {"c"}, "b": set(), "c": {"d"}, "d": set()}


def test_an_unreachable_metadata_file_is_one_line():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Fail) as e:
        resolved_sbom.fetch_metadata(
            f"http://u:secret@127.0.0.1:{port}/p-1-py3-none-any.whl", "p", "1"
        )
    msg = str(e.value)
    assert "\n" not in msg and "secret" not in msg
    assert f"could not be read from http://127.0.0.1:{port}/p-1-py3-none-any.whl.metadata" in msg


# What the tiny wheel requires, and what the served index holds for it.
REQUIRES = (
    'dep-a==1.0; python_version > "3.11"',  # true in the image's 3.12
    'dep-b==1.0; platform_machine == "aarch64"',
    "dep-lic==1.0",
    "dep-none==1.0",
    "dep-e==1.0; extra == 'audio'",
)
SERVED = {
    "dep_a": (("dep-c[fast]",), ("License-Expression: MIT",)),
    "dep_b": ((), ("License-Expression: Apache-2.0",)),
    "dep_c": (('dep-d; extra == "fast"',), ("License-Expression: BSD-3-Clause",)),
    "dep_d": ((), ("License: BSD-2-Clause",)),
    "dep_e": ((), ()),
    "dep_lic": ((), ("Classifier: License :: OSI Approved :: Apache Software License",)),
    "dep_none": ((), ("Classifier: Programming Language :: Python :: 3",)),
}


@pytest.fixture
def index(tmp_path: Path):
    """The served index: (URL, {wheel file name: sha256}, the served folder,
    the server: its `paths` asked for, its `ranges` switch)."""
    from tpfix.release.index import write_index

    served = tmp_path / "served"
    wheels = [
        make_wheel(served, "1.0", name, requires, fields)
        for name, (requires, fields) in SERVED.items()
    ]
    write_index(served, wheels)
    digests = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}
    with Served(served, ranges=True) as server:
        yield f"{server.url}/simple", digests, served, server


def _run(dist: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpfix.audit.resolved_sbom", "--dist", str(dist), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def _files(dist: Path) -> dict:
    return {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()}


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_resolved_sbom_from_the_index_for_the_image(tmp_path: Path, index):
    url, digests, _, server = index
    dist, wheel, _, _ = publish_small(tmp_path, requires=REQUIRES)
    proc = _run(dist, "--index-url", url)
    assert proc.returncode == 0, proc.stderr
    path = dist / f"{wheel.name}.resolved.cdx.json"
    text = path.read_text()
    sbom.validate(text)  # the CycloneDX 1.6 JSON schema
    back = Bom.from_json(json.loads(text))  # and the library's own deserializer
    doc = json.loads(text)
    comps = {c["name"]: c for c in doc["components"]}
    # markers for the image: 3.12 on x86_64, no extras of vllm; dep-c and dep-d
    # come from dep-a asking for dep-c[fast]
    assert sorted(comps) == ["dep-a", "dep-c", "dep-d", "dep-lic", "dep-none"]
    assert {str(c.purl) for c in back.components} == {f"pkg:pypi/{n}@1.0" for n in comps}
    for name, c in comps.items():
        file = f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
        assert c["version"] == "1.0"
        assert c["purl"] == c["bom-ref"] == f"pkg:pypi/{name}@1.0"
        assert c["hashes"] == [{"alg": "SHA-256", "content": digests[file]}]
        (ref,) = c["externalReferences"]
        assert ref["type"] == "distribution" and ref["url"].endswith("/" + file)
    lic = {n: c.get("licenses") for n, c in comps.items()}
    assert lic["dep-a"] == [{"expression": "MIT", "acknowledgement": "declared"}]
    assert lic["dep-d"] == [{"license": {"id": "BSD-2-Clause", "acknowledgement": "declared"}}]
    assert lic["dep-lic"] == [
        {"license": {"name": "Apache Software License", "acknowledgement": "declared"}}
    ]
    assert lic["dep-none"] is None  # its metadata states none: none is guessed
    source = {n: {p["name"]: p["value"] for p in c["properties"]} for n, c in comps.items()}
    assert source["dep-lic"]["tpfix:license-source"] == "classifier"
    assert source["dep-none"]["tpfix:license-source"] == "none stated in its metadata"
    # the root is our wheel, by the bom-ref of the wheel's SBOM, which it links
    root = doc["metadata"]["component"]
    declared = json.loads((dist / f"{wheel.name}.cdx.json").read_text())
    assert root["bom-ref"] == declared["metadata"]["component"]["bom-ref"]
    assert root["hashes"] == [{"alg": "SHA-256", "content": sums(dist)[wheel.name]}]
    assert root["externalReferences"][0] == {
        "type": "bom",
        "url": f"{wheel.name}.cdx.json",
        "comment": root["externalReferences"][0]["comment"],
    }
    graph = {d["ref"]: sorted(d.get("dependsOn", [])) for d in doc["dependencies"]}
    ref = {n: c["bom-ref"] for n, c in comps.items()}
    assert graph[root["bom-ref"]] == sorted(ref[n] for n in ("dep-a", "dep-lic", "dep-none"))
    assert graph[ref["dep-a"]] == [ref["dep-c"]] and graph[ref["dep-c"]] == [ref["dep-d"]]
    assert doc["compositions"] == [
        {
            "aggregate": "complete",
            "dependencies": [root["bom-ref"], *(c["bom-ref"] for c in doc["components"])],
        }
    ]
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props["tpfix:platform"].startswith("x86_64-manylinux_2_")
    assert props["tpfix:python"].startswith("CPython 3.12 ")
    assert props["tpfix:index"] == url
    assert "--format pylock.toml" in props["tpfix:resolved-by"]
    assert doc["metadata"]["timestamp"].startswith(props["tpfix:resolved-at"][:10])
    assert "uv" in {t["name"] for t in doc["metadata"]["tools"]["components"]}
    # metadata from PEP 658 files: no wheel was downloaded, by uv or by us
    asked = [path for path, _ in server.paths]
    assert any(a.endswith(".whl.metadata") for a in asked)
    assert not [a for a in asked if a.endswith(".whl")], asked
    assert f"{wheel.name}.resolved.cdx.json" in sums(dist)
    check_sums(dist)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_the_aarch64_wheel_resolves_for_aarch64_and_signs_again(tmp_path: Path, index):
    url, *_ = index
    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv, arch="aarch64", requires=REQUIRES)
    before = _files(dist)
    proc = _run(dist, "--index-url", url)  # a signed dist needs the key: nothing written
    assert proc.returncode == 2 and "give the signing key" in proc.stderr
    assert _files(dist) == before
    proc = _run(dist, "--index-url", url, "--sign-key", str(priv))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((dist / f"{wheel.name}.resolved.cdx.json").read_text())
    assert sorted(c["name"] for c in doc["components"]) == [
        "dep-a",
        "dep-b",  # aarch64 only
        "dep-c",
        "dep-d",
        "dep-lic",
        "dep-none",
    ]
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props["tpfix:platform"].startswith("aarch64-manylinux_2_")
    # signed again: the folder's statement lists the new file, and verifies
    envelope = json.loads((dist / attest.SUMS_ENVELOPE).read_text())
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    assert f"{wheel.name}.resolved.cdx.json" in {s["name"] for s in stmt["subject"]}
    check = [
        sys.executable,
        "-m",
        "tpfix.release.attest",
        "verify-dist",
        str(dist),
        "--key",
        str(pub),
    ]
    verified = subprocess.run(check, capture_output=True, text=True, cwd=ROOT)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    check_sums(dist)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_a_failed_resolution_exits_2_in_one_line_and_writes_nothing(tmp_path: Path):
    dist, _, _, _ = publish_small(tmp_path, requires=REQUIRES)
    before = _files(dist)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _run(dist, "--index-url", f"http://127.0.0.1:{port}/simple")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: uv could not resolve the requirements of vllm-")
    assert "so no resolved SBOM was written (uv: " in line
    assert _files(dist) == before


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_metadata_the_index_lacks_or_of_another_release_is_refused(index):
    url, _, served, server = index
    files = url.removesuffix("/simple")
    meta = resolved_sbom.fetch_metadata(f"{files}/dep_a-1.0-py3-none-any.whl", "dep-a", "1.0")
    assert resolved_sbom.licenses_of(meta)[1] == "License-Expression"
    with pytest.raises(Fail, match="describes dep-a 1.0, not dep-a 2.0"):
        resolved_sbom.fetch_metadata(f"{files}/dep_a-1.0-py3-none-any.whl", "dep-a", "2.0")
    # an index that serves no PEP 658 file: the wheel's own METADATA, by byte
    # ranges (its central directory and that file, not the wheel)
    (served / "dep_a-1.0-py3-none-any.whl.metadata").unlink()
    del server.paths[:]
    meta = resolved_sbom.fetch_metadata(f"{files}/dep_a-1.0-py3-none-any.whl", "dep-a", "1.0")
    assert resolved_sbom.licenses_of(meta)[1] == "License-Expression"
    asked = [path for path, _ in server.paths]
    assert asked[0].endswith(".whl.metadata") and len(asked) > 2, asked  # 404, then ranges
    server.ranges = False  # one that answers no ranges: refused, nothing downloaded
    with pytest.raises(Fail, match=r"whl \(the index answers no byte ranges \(HTTP 200\)\)"):
        resolved_sbom.fetch_metadata(f"{files}/dep_a-1.0-py3-none-any.whl", "dep-a", "1.0")
    with pytest.raises(Fail, match=r"dep_x-1.0-py3-none-any.whl \(File not found\)"):
        resolved_sbom.fetch_metadata(f"{files}/dep_x-1.0-py3-none-any.whl", "dep-x", "1.0")


def _readme_block(name: str) -> list[list[str]]:
    """The commands of the README's `name` block, as written (comments dropped)."""
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split(f"<!-- {name}:begin -->")[1].split(f"<!-- {name}:end -->")[0]
    code = block.split("```sh")[1].split("```")[0]
    return [shlex.split(ln, comments=True) for ln in code.splitlines() if ln.strip()]


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_the_readme_key_and_resolved_sbom_commands_work_on_a_two_arch_signed_dist(
    tmp_path: Path, index
):
    """The README's steps as a new operator runs them: its openssl commands make
    the key pair; ./build.sh --arch all --sign-key (the package stage of each
    arch, signed with that key); then its resolved_sbom line as written (here
    with the folder and the served index added): a resolved SBOM for each
    arch, the folder signed again, and verify.py --dist with the public key
    passes."""
    import shutil

    from tpfix.release import dist_verify

    url, *_ = index
    for argv in _readme_block("signing-key"):
        assert argv[0] == "openssl", argv
        subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True)
    key, pub = tmp_path / "operator.pem", tmp_path / "operator.pub.pem"
    publish_small(tmp_path, key=key, arch="x86_64", requires=REQUIRES)
    shutil.rmtree(tmp_path / "staging")
    dist, _, _, _ = publish_small(tmp_path, key=key, arch="aarch64", requires=REQUIRES)
    (argv,) = _readme_block("resolved-sbom")
    assert argv[:3] == ["build/venv/bin/python", "-m", "tpfix.audit.resolved_sbom"], argv
    argv = [sys.executable, *argv[1:], "--dist", str(dist), "--index-url", url]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    made = sorted(n for n in sums(dist) if n.endswith(".resolved.cdx.json"))
    assert [n.split("manylinux_2_28_")[1] for n in made] == [
        "aarch64.whl.resolved.cdx.json",
        "x86_64.whl.resolved.cdx.json",
    ]
    assert "x86_64: 5 resolved components" in proc.stderr, proc.stderr
    assert len(dist_verify.verify_dist(str(dist), str(pub))) == len(sums(dist))
    check_sums(dist)
