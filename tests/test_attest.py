# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Provenance and signing (tpfix.release.attest): the SLSA v1 statement about the
wheel, parsed back through in-toto-attestation; a DSSE envelope that verifies
with the operator's key only; the key read once and hidden from the build; a
bad key stopping the build before any download; URLs and the command line
recorded without credentials, local paths or output folders.

Fast tier: the pure functions and input checks.  Slow tier: the package stage
on a small dist/ (small_dist.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from small_dist import forge, keypair, publish_small, sha, statement, sums

from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.core.util import ROOT, Fail, public_url
from tpfix.release import attest


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_provenance_is_a_slsa_v1_statement_about_the_wheel(tmp_path: Path):
    dist, wheel, sdist, official = publish_small(tmp_path)
    stmt = statement(dist / f"{wheel.name}.provenance.json")
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    assert stmt["subject"] == [{"name": wheel.name, "digest": {"sha256": sha(wheel)}}]
    bd = stmt["predicate"]["buildDefinition"]
    line = get_line()
    want = {sdist.name: sha(sdist), official.name: sha(official)}
    names = read_series(line.series)
    want.update({f"patches/{line.tag}/{n}": sha(line.patches / n) for n in names})
    assert {d["name"]: d["digest"]["sha256"] for d in bd["resolvedDependencies"]} == want
    assert bd["externalParameters"]["line"] == line.tag
    assert bd["externalParameters"]["version"] == get_line().version
    assert bd["internalParameters"]["SOURCE_DATE_EPOCH"] == "1700000000"
    (builder,) = stmt["predicate"]["runDetails"]["builder"]["builderDependencies"]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert builder["digest"] == {"gitCommit": head}
    assert "startedOn" not in json.dumps(stmt)  # reproducible: no clock in it


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_signed_provenance_verifies_with_the_operators_key_only(tmp_path: Path):
    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    env = dist / f"{wheel.name}.intoto.jsonl"
    assert wheel.name + ".intoto.jsonl" in sums(dist)
    stmt = attest.verify(env, pub, wheel)
    assert stmt == json.loads((dist / f"{wheel.name}.provenance.json").read_text())
    # the CLI an operator runs
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpfix.release.attest",
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
    _, other_pub = keypair(tmp_path / "other")
    with pytest.raises(Fail, match="no signature verifies"):
        attest.verify(env, other_pub, wheel)
    forged = forge(env, tmp_path / "forged.intoto.jsonl")
    with pytest.raises(Fail, match="no signature verifies"):
        attest.verify(forged, pub, wheel)
    with pytest.raises(Fail, match="is not the subject"):
        attest.verify(env, pub, dist / f"{wheel.name}.metadata")


def test_the_signing_key_is_loaded_once_and_hidden_from_the_build(tmp_path: Path, monkeypatch):
    """The key's path and passphrase leave the environment before any build
    step runs (upstream's setup.py inherits it)."""
    priv, _ = keypair(tmp_path, b"a passphrase")
    monkeypatch.setenv("TPFIX_SIGNING_KEY", str(priv))
    monkeypatch.setenv("TPFIX_SIGNING_KEY_PASSWORD", "a passphrase")
    signer = attest.signing_key(None)
    assert signer is not None
    assert "TPFIX_SIGNING_KEY" not in os.environ
    assert "TPFIX_SIGNING_KEY_PASSWORD" not in os.environ
    assert attest.signing_key(None) is None  # nothing given: unsigned


def test_a_statement_of_another_kind_is_refused(tmp_path: Path):
    priv, pub = keypair(tmp_path)
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


def test_recorded_command_leaves_out_output_folders_only():
    args = ["--line", "v0.34.0", "--dist", "/x", "--workdir=/w", "--sign-key", "k", "--image"]
    args.insert(2, "--no-cache")  # a rebuild from the cache: the same bytes
    pipeline = str(ROOT / "scripts" / "tpfix" / "pipeline.py")  # sys.argv[0] of ./build.sh
    assert attest.build_command([pipeline, *args]) == "./build.sh --line v0.34.0 --image"
    image = str(ROOT / "scripts" / "tpfix" / "image" / "__main__.py")  # python -m tpfix.image
    assert attest.build_command([image, "--dist", "d"]) == "python -m tpfix.image"
    # a module of a group folder: its dotted name
    advisories = str(ROOT / "scripts" / "tpfix" / "audit" / "advisories.py")
    assert attest.build_command([advisories]) == "python -m tpfix.audit.advisories"
