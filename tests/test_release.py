# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What dist/ holds beside the wheel: SBOM, provenance (signed or not), index,
SHA256SUMS, and the advisory report with its VEX.

The package stage (tpfix.package.describe + publish, the real code) runs on a
tiny wheel made here, with two small files standing in for the upstream sdist
and official wheel (only their sha256 goes into the documents) and the
default line's real series.  The advisory tests run the real pip-audit
against an OSV-compatible service simulated on 127.0.0.1 (it answers one
made-up advisory for vllm 0.27.1 and one for jinja2), and against a port
nobody listens on; the real uv resolves from an index of tiny wheels served
on 127.0.0.1.

Fast tier: the checks of inputs and the pure functions (triage entries, URLs,
a missing tool or a bad key stopping the build); the tier for editing a
patch needs no more of this.  Slow tier: every package stage, subprocess or
server, the same checks on the dist/ of a real ./build.sh, and the real
advisory command against the real index.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from test_index import make_wheel

from tpfix import advisories, attest, package, sbom, triage
from tpfix.common import (
    ROOT,
    Fail,
    get_line,
    line_names,
    public_url,
    read_version,
    sdist_pin,
    wheel_pin,
)
from tpfix.patch_format import read_series

SIDE = (".cdx.json", ".provenance.json", ".metadata")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _sums(dist: Path) -> dict[str, str]:
    lines = (dist / "SHA256SUMS").read_text().splitlines()
    return {ln.split("  ", 1)[1]: ln.split("  ", 1)[0] for ln in lines}


def _check_sums(dist: Path) -> None:
    """`sha256sum -c` (the coreutils tool an operator runs) accepts SHA256SUMS."""
    proc = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=dist, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _keypair(folder: Path, password: bytes | None = None) -> tuple[Path, Path]:
    """A throwaway ed25519 key pair, made for this test only."""
    key = ed25519.Ed25519PrivateKey.generate()
    priv, pub = folder / "signing.pem", folder / "signing.pub.pem"
    enc = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    priv.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    )
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return priv, pub


def _publish_small(tmp: Path, version: str = "0.27.1+tpfix.3", key: Path | None = None):
    """The package stage on a tiny wheel: returns (dist, wheel, sdist, official)."""
    staging, dist = tmp / "staging", tmp / "dist"
    wheel = make_wheel(staging, version)
    sdist, official = tmp / "vllm-0.27.1.tar.gz", tmp / "vllm-0.27.1-py3-none-any.whl"
    sdist.write_bytes(b"stand-in for the pinned sdist")
    official.write_bytes(b"stand-in for the official wheel")
    signer = attest.load_signer(key) if key else None
    extras = package.describe(wheel, get_line(), sdist, official, "x86_64", "1700000000", signer)
    final = package.publish(wheel, dist, extras)
    return dist, final, sdist, official


def _statement(path: Path) -> dict:
    """The statement, parsed back through in-toto-attestation's own validator."""
    data = json.loads(path.read_text())
    pb = json_format.ParseDict(data, statement_pb2.Statement())
    Statement.copy_from_pb(pb).validate()
    return data


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
    from tpfix.patch_format import read_patch

    return read_patch(path).header.trailers


# --- fast: the package stage on a small wheel ---------------------------------------


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_dist_holds_the_wheel_sbom_provenance_and_index_all_in_sha256sums(tmp_path: Path):
    dist, wheel, sdist, official = _publish_small(tmp_path)
    files = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file())
    expected = sorted(
        [wheel.name, *(wheel.name + s for s in SIDE), "SHA256SUMS"]
        + ["simple/index.html", "simple/vllm/index.html"]
    )
    assert files == expected
    assert sorted(_sums(dist)) == sorted(set(expected) - {"SHA256SUMS"})
    _check_sums(dist)
    assert not (tmp_path / "staging").exists() or not any((tmp_path / "staging").iterdir())


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


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_provenance_is_a_slsa_v1_statement_about_the_wheel(tmp_path: Path):
    dist, wheel, sdist, official = _publish_small(tmp_path)
    stmt = _statement(dist / f"{wheel.name}.provenance.json")
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    assert stmt["subject"] == [{"name": wheel.name, "digest": {"sha256": _sha(wheel)}}]
    bd = stmt["predicate"]["buildDefinition"]
    line = get_line()
    want = {sdist.name: _sha(sdist), official.name: _sha(official)}
    names = read_series(line.series)
    want.update({f"patches/{line.tag}/{n}": _sha(line.patches / n) for n in names})
    assert {d["name"]: d["digest"]["sha256"] for d in bd["resolvedDependencies"]} == want
    assert bd["externalParameters"]["line"] == line.tag
    assert bd["externalParameters"]["version"] == read_version()
    assert bd["internalParameters"]["SOURCE_DATE_EPOCH"] == "1700000000"
    (builder,) = stmt["predicate"]["runDetails"]["builder"]["builderDependencies"]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert builder["digest"] == {"gitCommit": head}
    assert "startedOn" not in json.dumps(stmt)  # reproducible: no clock in it


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_package_stage_is_byte_reproducible(tmp_path: Path):
    a, wa, _, _ = _publish_small(tmp_path / "a")
    b, wb, _, _ = _publish_small(tmp_path / "b")
    assert (a / "SHA256SUMS").read_bytes() == (b / "SHA256SUMS").read_bytes()


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_signed_provenance_verifies_with_the_operators_key_only(tmp_path: Path):
    priv, pub = _keypair(tmp_path)
    dist, wheel, _, _ = _publish_small(tmp_path, key=priv)
    env = dist / f"{wheel.name}.intoto.jsonl"
    assert wheel.name + ".intoto.jsonl" in _sums(dist)
    stmt = attest.verify(env, pub, wheel)
    assert stmt == json.loads((dist / f"{wheel.name}.provenance.json").read_text())
    # the CLI an operator runs
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpfix.attest",
            "verify",
            str(env),
            "--key",
            str(pub),
            "--artifact",
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "signature OK" in proc.stdout, proc.stderr
    # another key, a changed payload, another artifact: each refused
    (tmp_path / "other").mkdir()
    _, other_pub = _keypair(tmp_path / "other")
    with pytest.raises(Fail, match="signature does not verify"):
        attest.verify(env, other_pub, wheel)
    data = json.loads(env.read_text())
    payload = json.loads(base64.b64decode(data["payload"]))
    payload["subject"][0]["digest"]["sha256"] = "0" * 64
    data["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    forged = tmp_path / "forged.intoto.jsonl"
    forged.write_text(json.dumps(data))
    with pytest.raises(Fail, match="signature does not verify"):
        attest.verify(forged, pub, wheel)
    with pytest.raises(Fail, match="is not the subject"):
        attest.verify(env, pub, dist / f"{wheel.name}.metadata")


def test_the_signing_key_is_loaded_once_and_hidden_from_the_build(tmp_path: Path, monkeypatch):
    """The key's path and passphrase leave the environment before any build
    step runs (upstream's setup.py inherits it)."""
    priv, _ = _keypair(tmp_path, b"a passphrase")
    monkeypatch.setenv("TPFIX_SIGNING_KEY", str(priv))
    monkeypatch.setenv("TPFIX_SIGNING_KEY_PASSWORD", "a passphrase")
    signer = attest.signing_key(None)
    assert signer is not None
    assert "TPFIX_SIGNING_KEY" not in os.environ
    assert "TPFIX_SIGNING_KEY_PASSWORD" not in os.environ
    assert attest.signing_key(None) is None  # nothing given: unsigned


def test_a_statement_of_another_kind_is_refused(tmp_path: Path):
    priv, pub = _keypair(tmp_path)
    env = tmp_path / "other.intoto.jsonl"
    payload = json.dumps(
        {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [],
            "predicateType": "https://example.invalid/other",
        }
    ).encode()
    env.write_text(attest.sign(payload, attest.load_signer(priv)))
    with pytest.raises(Fail, match="not an in-toto v1 statement with a SLSA v1 provenance"):
        attest.verify(env, pub)


@pytest.mark.parametrize(
    ("url", "published"),
    [
        (
            "https://alice:ghp_SECRET@github.com/acme/vllm-tpfix.git",
            "https://github.com/acme/vllm-tpfix.git",
        ),
        ("git@github.com:acme/vllm-tpfix.git", "ssh://github.com/acme/vllm-tpfix.git"),
        ("https://idx.example/simple?token=SECRET#x", "https://idx.example/simple"),
        ("/work/main", ""),
        ("file:///work/main", ""),
        ("", ""),
    ],
)
def test_urls_are_published_without_credentials_or_local_paths(url: str, published: str):
    """What goes into the provenance and the image's source label."""
    assert public_url(url) == published


def test_a_bad_signing_key_stops_the_build_before_any_download(tmp_path: Path):
    bad = tmp_path / "key.pem"
    bad.write_text("not a key\n")
    env = dict(os.environ, TPFIX_SIGNING_KEY=str(bad))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpfix.pipeline",
            "--dist",
            str(tmp_path / "dist"),
            "--workdir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert f"signing key {bad}" in proc.stderr and "PEM private key" in proc.stderr
    assert "==> fetch" not in proc.stderr
    assert not (tmp_path / "dist").exists()


def test_a_missing_tool_is_named_before_any_download(monkeypatch):
    from tpfix import pipeline

    monkeypatch.setitem(pipeline.TOOLS, "tpfix_no_such_module", ("simple503", "the index"))
    with pytest.raises(Fail, match=r"missing in .*: simple503 \(the index\); ./build.sh"):
        pipeline.check_tools()


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_republishing_replaces_every_file_of_the_old_wheel(tmp_path: Path):
    dist, old, _, _ = _publish_small(tmp_path / "one", "0.27.1+tpfix.2")
    (dist / f"{old.name}.vex.cdx.json").write_text("{}")  # an advisory report of the old one
    shutil.rmtree(tmp_path / "one" / "staging")
    staging = tmp_path / "one" / "staging"
    wheel = make_wheel(staging, "0.27.1+tpfix.3")
    sd = tmp_path / "one" / "vllm-0.27.1.tar.gz"
    off = tmp_path / "one" / "vllm-0.27.1-py3-none-any.whl"
    extras = package.describe(wheel, get_line(), sd, off, "x86_64", "1", None)
    new = package.publish(wheel, dist, extras)
    assert not [p for p in dist.iterdir() if p.name.startswith(old.name)]
    assert sorted(p.name for p in dist.glob("vllm-*")) == sorted(
        [new.name, *(new.name + s for s in SIDE)]
    )
    assert "0.27.1+tpfix.2" not in (dist / "simple" / "vllm" / "index.html").read_text()
    _check_sums(dist)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_a_publish_killed_at_any_step_leaves_whole_files_and_the_next_repairs(
    tmp_path: Path, monkeypatch
):
    """Kill publish (KeyboardInterrupt, as SIGTERM becomes) at its n-th move or
    at SHA256SUMS: every file is the old or the new one in full, and a new
    publish leaves a dist/ that `sha256sum -c` accepts, with nothing stale."""
    dist, old, sd, off = _publish_small(tmp_path / "first", "0.27.1+tpfix.2")
    (dist / "image").mkdir()
    (dist / "image" / "old.cdx.json").write_text("{}")  # an image of the old wheel
    package.write_sums(dist, [*package.listed(dist), Path("image/old.cdx.json")])
    whole = {p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    old_sums = (dist / "SHA256SUMS").read_bytes()
    real_replace = os.replace
    for n in range(1, 12):
        staging = tmp_path / f"staging{n}"
        wheel = make_wheel(staging, "0.27.1+tpfix.3")
        extras = package.describe(wheel, get_line(), sd, off, "x86_64", "1", None)
        staged = {p.relative_to(staging): p.read_bytes() for p in staging.rglob("*") if p.is_file()}
        whole |= set(staged.values())
        calls = []

        def dying_replace(src, dst, calls=calls, n=n):
            calls.append(dst)
            if len(calls) == n:
                raise KeyboardInterrupt
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", dying_replace)
        try:
            package.publish(wheel, dist, extras)
            finished = True
        except KeyboardInterrupt:
            finished = False
        monkeypatch.setattr(os, "replace", real_replace)
        for p in dist.rglob("*"):
            if p.is_file() and not p.name.startswith(".") and p.name != "SHA256SUMS":
                assert p.read_bytes() in whole, f"step {n}: {p} is not a whole file"
        # SHA256SUMS is the old one, or a new one all of whose files are in place
        if (dist / "SHA256SUMS").read_bytes() != old_sums:
            _check_sums(dist)
        if finished:
            break
    else:
        pytest.fail("publish never got past 11 moves")
    assert n > 3  # it was killed at each earlier step
    # the next build (here: the same files staged again) repairs whatever was left
    staging = tmp_path / "again"
    wheel = make_wheel(staging, "0.27.1+tpfix.3")
    package.publish(wheel, dist, package.describe(wheel, get_line(), sd, off, "x86_64", "1", None))
    _check_sums(dist)
    assert not (dist / "image" / "old.cdx.json").exists()  # listed before, not now: removed
    assert not [p for p in dist.glob("vllm-0.27.1+tpfix.2*")]


# --- advisories --------------------------------------------------------------------

ADVISORY = {
    "id": "GHSA-tpfx-test-0001",
    "aliases": ["CVE-2099-0001"],
    "summary": "made-up advisory for this test",
    "affected": [
        {
            "package": {"name": "vllm", "ecosystem": "PyPI"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "0.28.0"}]}],
        }
    ],
}


class _OSV(http.server.BaseHTTPRequestHandler):
    """Simulated OSV API: POST /v1/query answers ADVISORY for vllm 0.27.1 and a
    made-up one for jinja2 3.1.6 (a project the SBOM does not declare), else nothing."""

    asked: list = []

    def do_POST(self):
        q = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.asked.append((q["package"]["name"], q["version"]))
        asked = (q["package"]["name"], q["version"])
        other = dict(ADVISORY, id="GHSA-tpfx-test-0002", aliases=[])
        other["affected"] = [
            dict(ADVISORY["affected"][0], package={"name": "jinja2", "ecosystem": "PyPI"})
        ]
        vulns = {("vllm", "0.27.1"): [ADVISORY], ("jinja2", "3.1.6"): [other]}.get(asked)
        body = json.dumps({"vulns": vulns} if vulns else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def osv():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OSV)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _OSV.asked = []
    yield f"http://127.0.0.1:{server.server_port}/v1/query"
    server.shutdown()


def _advise(dist: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpfix.advisories", "--dist", str(dist), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def _pinned(tmp: Path) -> Path:
    req = tmp / "pinned.txt"
    req.write_text("vllm==0.27.1+tpfix.3\njinja2==3.1.6\nflashinfer-python==0.6.16.post4\n")
    return req


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_advisory_report_and_vex_from_the_service(tmp_path: Path, osv: str):
    dist, wheel, _, _ = _publish_small(tmp_path)
    proc = _advise(
        dist, "--requirements", str(_pinned(tmp_path)), "--service", "osv", "--osv-url", osv
    )
    assert proc.returncode == 0, proc.stderr
    # vllm is asked for as its upstream version, as scanners read ours
    assert sorted(_OSV.asked) == [
        ("flashinfer-python", "0.6.16.post4"),
        ("jinja2", "3.1.6"),
        ("vllm", "0.27.1"),
    ]
    report = json.loads((dist / f"{wheel.name}.advisories.json").read_text())
    (vllm,) = [d for d in report["dependencies"] if d["name"] == "vllm"]
    assert [v["id"] for v in vllm["vulns"]] in (["GHSA-tpfx-test-0001"], ["CVE-2099-0001"])
    vex_text = (dist / f"{wheel.name}.vex.cdx.json").read_text()
    sbom.validate(vex_text)
    vex = json.loads(vex_text)
    doc = json.loads((dist / f"{wheel.name}.cdx.json").read_text())
    serial = doc["serialNumber"].removeprefix("urn:uuid:")
    by_project = {v["bom-ref"].split(":", 1)[1].split("@")[0]: v for v in vex["vulnerabilities"]}
    assert sorted(by_project) == ["jinja2", "vllm"]
    v = by_project["vllm"]  # ours: a BOM-Link to the SBOM's root
    assert v["affects"] == [
        {"ref": f"urn:cdx:{serial}/1#{doc['metadata']['component']['bom-ref']}"}
    ]
    assert v["analysis"]["state"] == "in_triage"  # no advisories.toml entry for it
    assert v["recommendation"] == "fixed in 0.28.0"
    # every BOM-Link names a bom-ref the SBOM has; any other ref a component of the VEX
    sbom_refs = {
        doc["metadata"]["component"]["bom-ref"],
        *(c["bom-ref"] for c in doc["components"]),
    }
    vex_refs = {c["bom-ref"] for c in vex.get("components", [])}
    for vuln in vex["vulnerabilities"]:
        for a in vuln["affects"]:
            link = a["ref"].removeprefix(f"urn:cdx:{serial}/1#")
            assert link in sbom_refs if link != a["ref"] else a["ref"] in vex_refs, a
    assert by_project["jinja2"]["affects"] == [{"ref": "pkg:pypi/jinja2@3.1.6"}]
    # the SBOM names where its VEX is
    ext = doc["metadata"]["component"]["externalReferences"]
    assert {"type": "exploitability-statement", "url": f"{wheel.name}.vex.cdx.json"} in [
        {k: e[k] for k in ("type", "url")} for e in ext
    ]
    assert {f"{wheel.name}.advisories.json", f"{wheel.name}.vex.cdx.json"} <= set(_sums(dist))
    _check_sums(dist)


def _triaged_line(tmp: Path, text: str):
    """The default line's series, with an advisories.toml of `text`."""
    repo = tmp / "repo"
    line = get_line()
    folder = repo / "patches" / line.tag
    shutil.copytree(line.patches, folder, dirs_exist_ok=True)
    (folder / "advisories.toml").write_text(text)
    return type(line).at(folder)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_vex_takes_the_lines_triage(tmp_path: Path, osv: str):
    """advisories.toml beside the series: a patch that resolves it, or why it does not apply."""
    name = read_series(get_line().series)[1]
    report = advisories.audit([("vllm", "0.27.1")], "osv", osv)
    for state, extra, want_detail in [
        ("resolved_with_pedigree", f'patch = "{name}"', f"fixed by {name} of the series"),
        ("not_affected", 'justification = "code_not_reachable"', "unused API"),
    ]:
        line = _triaged_line(
            tmp_path,
            f'[[advisory]]\nid = "CVE-2099-0001"\nstate = "{state}"\n{extra}\n'
            'detail = "unused API"\n',
        )
        dist, wheel, sdist, official = _publish_small(tmp_path / state)
        vex = json.loads(advisories.vex(report, dist / f"{wheel.name}.cdx.json", line))
        (v,) = vex["vulnerabilities"]
        assert v["analysis"]["state"] == state
        assert want_detail in v["analysis"]["detail"]
        if state == "not_affected":
            assert v["analysis"]["justification"] == "code_not_reachable"
        else:  # and the SBOM names it among what that patch resolves
            doc = sbom.wheel_bom(wheel, line, sdist, official, 1)
            (patch,) = [
                p
                for p in doc.metadata.component.pedigree.patches
                if p.resolves and any(i.id == name for i in p.resolves)
            ]
            assert {(i.type.value, i.id) for i in patch.resolves} == {
                ("defect", name),
                ("security", "CVE-2099-0001"),
            }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[advisory]]\nid = "X"\nstate = "resolved_with_pedigree"\npatch = "9999-nope.patch"\n',
            "`patch` must name a patch of the series",
        ),
        ('[[advisory]]\nid = "X"\nstate = "fixed"\n', "state must be one of"),
        ('[[advisory]]\nid = "X"\nstate = "not_affected"\n', "needs a `justification`"),
        (
            '[[advisory]]\nid = "X"\nstate = "not_affected"\njustification = "nah"\n',
            "justification must be one of",
        ),
        ('[[advisory]\nid = "X"\n', "not valid TOML"),
        ('[[advisory]]\nstate = "in_triage"\n', "needs an `id`"),
    ],
)
def test_a_bad_triage_entry_is_refused_before_any_audit(tmp_path: Path, text: str, message: str):
    with pytest.raises(Fail, match=re.escape(message)):
        triage.load_triage(_triaged_line(tmp_path, text))


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_markers_are_evaluated_for_the_image_not_this_host(tmp_path: Path):
    """This host runs Python 3.11 on x86_64; the image runs 3.12 (and the
    aarch64 wheel an aarch64 one): what the audit must cover follows the image."""
    wheel = make_wheel(
        tmp_path,
        requires=(
            "always==1",
            'newer; python_version > "3.11"',
            'arm; platform_machine == "aarch64"',
            "extra-only; extra == 'audio'",
        ),
    )
    line = get_line()
    x86 = advisories.target(line, "x86_64")
    assert x86["python"] == "3.12" and x86["platform"].startswith("x86_64-manylinux_2_")
    assert advisories.needed(wheel, x86["env"]) == {"always", "newer"}
    arm = advisories.target(line, "aarch64")
    assert advisories.needed(wheel, arm["env"]) == {"always", "newer", "arm"}
    with pytest.raises(Fail, match="lacks 1 of the wheel's requirements on the target.*newer"):
        advisories.check_covers([("always", "1")], advisories.needed(wheel, x86["env"]), "a set")


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_uv_resolves_the_wheel_for_the_image_from_an_index(tmp_path: Path):
    """The real resolver (uv), from an index of tiny wheels served on 127.0.0.1
    (our own tpfix.index pages): a requirement with a marker true only in the
    image's Python is resolved, one true only on aarch64 is not."""
    from tpfix.index import write_index

    served = tmp_path / "served"
    wheel = make_wheel(
        served,
        requires=(
            'dep-a==1.0; python_version > "3.11"',
            'dep-b==1.0; platform_machine == "aarch64"',
        ),
    )
    deps = [make_wheel(served, "1.0", name, ()) for name in ("dep_a", "dep_b")]
    write_index(served, [wheel, *deps])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/simple"
        tgt = advisories.target(get_line(), "x86_64")
        pins = advisories.resolve(wheel, tgt, url)
    finally:
        server.shutdown()
    assert sorted(pins) == [("dep-a", "1.0"), ("vllm", wheel.name.split("-")[1])]


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_unreachable_advisory_source_fails_loudly_and_writes_nothing(tmp_path: Path):
    dist, wheel, _, _ = _publish_small(tmp_path)
    before = {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _advise(
        dist,
        "--requirements",
        str(_pinned(tmp_path)),
        "--service",
        "osv",
        "--osv-url",
        f"http://127.0.0.1:{port}/v1/query",
    )
    assert proc.returncode == 2
    assert "could not be queried, so nothing was audited and nothing written" in proc.stderr
    assert "no known" not in (proc.stdout + proc.stderr).lower()
    assert {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()} == before


def test_unpinned_requirements_are_refused(tmp_path: Path):
    req = tmp_path / "r.txt"
    req.write_text("jinja2>=3\n")
    with pytest.raises(Fail, match="is not pinned"):
        advisories.read_requirements(req)


# --- slow: the real build's dist/ and the real advisory source ------------------------


@pytest.mark.slow
def test_built_dist_holds_valid_sbom_provenance_and_index(built_wheel: Path):
    dist = built_wheel.parent
    arch = built_wheel.name.rsplit("_", 2)[-2] if "aarch64" in built_wheel.name else "x86_64"
    listed = set(_sums(dist))
    assert listed == {
        built_wheel.name,
        *(built_wheel.name + s for s in SIDE),
        "simple/index.html",
        "simple/vllm/index.html",
    }
    _check_sums(dist)
    _check_sbom(
        dist / f"{built_wheel.name}.cdx.json",
        built_wheel,
        sdist_pin().sha256,
        wheel_pin(arch).sha256,
    )
    stmt = _statement(dist / f"{built_wheel.name}.provenance.json")
    assert stmt["subject"][0]["digest"]["sha256"] == _sha(built_wheel)
    # ./build.sh --dist D --workdir W: the output folders are not recorded
    assert stmt["predicate"]["buildDefinition"]["externalParameters"]["command"] == "./build.sh"


def test_recorded_command_leaves_out_output_folders_only():
    args = ["--line", "v0.33.0", "--dist", "/x", "--workdir=/w", "--sign-key", "k", "--image"]
    pipeline = str(ROOT / "scripts" / "tpfix" / "pipeline.py")  # sys.argv[0] of ./build.sh
    assert attest.build_command([pipeline, *args]) == "./build.sh --line v0.33.0 --image"
    image = str(ROOT / "scripts" / "tpfix" / "image.py")
    assert attest.build_command([image, "--dist", "d"]) == "python -m tpfix.image"


@pytest.mark.slow
def test_real_advisory_source_reports_or_fails_loudly(built_wheel: Path, tmp_path: Path):
    """The real command on the real wheel: pip resolves its requirements from
    the configured index, pip-audit asks the index's advisory data.  Either a
    full, valid report, or exit 2 saying what could not be resolved or
    audited, with dist/ untouched: never a silent "no advisories"."""
    dist = tmp_path / "dist"
    shutil.copytree(built_wheel.parent, dist)
    before = {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    proc = _advise(dist)
    if proc.returncode == 0:
        sbom.validate((dist / f"{built_wheel.name}.vex.cdx.json").read_text())
        report = json.loads((dist / f"{built_wheel.name}.advisories.json").read_text())
        tgt = advisories.target(get_line(), "x86_64")
        audited = {d["name"] for d in report["dependencies"]}
        assert advisories.needed(built_wheel, tgt["env"]) <= audited
        assert report["tpfix"]["projects"] == len(audited) > 50
        assert "vllm" in audited and "torch" in audited
        _check_sums(dist)
    else:
        assert proc.returncode == 2, proc.stderr
        assert (
            "so they cannot be audited" in proc.stderr  # uv could not resolve
            or "could not be queried, so nothing was audited" in proc.stderr
            or "could not be audited against" in proc.stderr
        ), proc.stderr
        assert "Traceback" not in proc.stderr
        assert {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()} == before
    print(proc.stderr)


@pytest.mark.parametrize("name", [n for n in line_names()])
def test_every_lines_triage_file_loads(name: str):
    path, entries = triage.load_triage(get_line(name))
    assert path.exists(), f"{path}: each line keeps its (possibly empty) triage"
    assert isinstance(entries, dict)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_image_environment_audited_from_the_images_sbom(tmp_path: Path, osv: str):
    """--image: the exact set an image's SBOM lists (sbom.image_bom, the real
    code, on an inventory written here), report and VEX beside that SBOM."""
    # the image holds our wheel: the same version in the SBOM and the inventory
    dist, wheel, sdist, official = _publish_small(tmp_path, read_version())
    inventory = {
        "base": {"name": "vllm/vllm-openai:v0.27.1", "digest": "sha256:" + "1" * 64},
        "image": {"ref": "localhost/x:1", "config_digest": "sha256:" + "2" * 64, "layers": []},
        "python": [
            {"name": "vllm", "version": read_version(), "location": "/usr/lib"},
            {"name": "jinja2", "version": "3.1.6", "location": "/usr/lib"},
            {"name": "flashinfer_python", "version": "0.6.16.post4", "location": "/usr/lib"},
            {"name": "torch", "version": "2.13.0+cu130", "location": "/usr/lib"},
        ],
    }
    comp = sbom.wheel_component(wheel, get_line(), sdist, official)
    (dist / "image").mkdir()
    img = dist / "image" / "x-1.cdx.json"
    img.write_text(sbom.dumps(sbom.image_bom(inventory, comp, 1, read_version(), "v0.27.1", "x-1")))
    proc = _advise(dist, "--image", str(img), "--service", "osv", "--osv-url", osv)
    assert proc.returncode == 0, proc.stderr
    # local versions asked for as their public one
    assert sorted(_OSV.asked) == [
        ("flashinfer-python", "0.6.16.post4"),
        ("jinja2", "3.1.6"),
        ("torch", "2.13.0"),
        ("vllm", "0.27.1"),
    ]
    vex = json.loads((dist / "image" / "x-1.vex.cdx.json").read_text())
    serial = json.loads(img.read_text())["serialNumber"].removeprefix("urn:uuid:")
    # pip-audit names an advisory by its id or an alias: by project here
    affects = {v["bom-ref"].split(":", 1)[1]: v["affects"] for v in vex["vulnerabilities"]}
    assert affects["vllm@0.27.1"] == [{"ref": f"urn:cdx:{serial}/1#{comp.bom_ref.value}"}]
    # jinja2 is in the image's SBOM: linked there, not described again
    assert affects["jinja2@3.1.6"] == [{"ref": f"urn:cdx:{serial}/1#pkg:pypi/jinja2@3.1.6"}]
    assert not vex.get("components")
    assert {"image/x-1.advisories.json", "image/x-1.vex.cdx.json"} <= set(_sums(dist))
