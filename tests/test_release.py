# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What dist/ holds beside the wheel: SBOM, provenance (signed or not), index
and SHA256SUMS.  The SBOM's content: tests/test_sbom.py; the advisory report
and its VEX: tests/test_advisories.py (both use the helpers here).

The package stage (tpfix.package.describe + publish, the real code) runs on a
tiny wheel made here, with two small files standing in for the upstream sdist
and official wheel (only their sha256 goes into the documents) and the
default line's real series.

Fast tier: the checks of inputs and the pure functions (URLs, a missing tool
or a bad key stopping the build); the tier for editing a patch needs no more
of this.  Slow tier: every package stage, subprocess or server, and the same
checks on the dist/ of a real ./build.sh.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from test_index import make_wheel

from tpfix import attest, package
from tpfix.lines import get_line, read_version, sdist_pin, wheel_pin
from tpfix.patch_format import read_series
from tpfix.util import ROOT, Fail, public_url

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
    from test_sbom import _check_sbom  # (test_sbom imports this module)

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
