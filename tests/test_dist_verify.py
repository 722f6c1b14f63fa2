# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Checking a signed dist/ with nothing but what dist/ holds: verify.py
(scripts/tpfix/release/dist_verify.py) in a Python that has only `cryptography`,
and `tpfix.release.attest verify` / `verify-dist`, which must give the same verdict
and exit code on every input.  On small dists (tests/small_dist.py).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from small_dist import forge, keypair, publish_small, sha, sums

from tpfix.core.util import Fail
from tpfix.release import dist_verify
from tpfix.stages import package


@pytest.mark.slow  # a subprocess for the release artifacts
def test_attest_verify_without_artifact_is_refused(tmp_path: Path):
    priv, pub = keypair(tmp_path)
    from tpfix.release import attest

    stmt = tmp_path / "x.provenance.json"
    subject = [{"name": "x.whl", "digest": {"sha256": "0" * 64}}]
    doc = {"_type": attest.STATEMENT_TYPE, "predicateType": attest.PREDICATE_TYPE}
    stmt.write_text(json.dumps({**doc, "subject": subject, "predicate": {"buildDefinition": {}}}))
    env = tmp_path / "x.intoto.jsonl"
    env.write_text(attest.sign(stmt.read_bytes(), attest.load_signer(priv)))
    cmd = [sys.executable, "-m", "tpfix.release.attest", "verify", str(env), "--key", str(pub)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "signature OK" not in proc.stdout
    assert "give --artifact FILE" in proc.stderr and "--signature-only" in proc.stderr
    proc = subprocess.run([*cmd, "--signature-only"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "signature OK (signature only: no artifact checked)" in proc.stdout
    # a missing or unreadable --artifact: one line naming it, no traceback
    for bad in (tmp_path / "nope.whl", tmp_path):
        proc = subprocess.run([*cmd, "--artifact", str(bad)], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "signature OK" not in proc.stdout
        assert f"--artifact {bad}: cannot read it" in proc.stderr, proc.stderr


def _clean_python(tmp_path: Path) -> Path:
    """A fresh venv that sees `cryptography` (from this one's site-packages,
    added as a plain path: no .pth of it runs, so no editable tpfix) and
    nothing of this repository."""
    env = tmp_path / "clean-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = env / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [py, "-I", "-c", "import cryptography, importlib.util as u; print(u.find_spec('tpfix'))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
    return py


@pytest.mark.slow  # a package stage (about a second) and a venv
def test_dist_verify_py_checks_a_signed_dist_without_this_repository(tmp_path: Path):
    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    verify_py = dist / "verify.py"
    assert "verify.py" in (dist / "SHA256SUMS").read_text()
    env = dist / f"{wheel.name}.intoto.jsonl"
    got = tmp_path / "received"  # what someone gets: dist/ alone
    shutil.copytree(dist, got)
    py = _clean_python(tmp_path)

    def check(envelope: Path, artifact: Path, key: Path = pub):
        return subprocess.run(
            [py, "-I", str(got / "verify.py"), str(envelope), "--key", str(key)]
            + ["--artifact", str(artifact)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    genv, gwheel = got / env.name, got / wheel.name
    proc = check(genv, gwheel)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"OK: {gwheel} is the signed subject of {genv}")
    # a changed wheel
    tampered = tmp_path / wheel.name
    data = bytearray(gwheel.read_bytes())
    data[len(data) // 2] ^= 1
    tampered.write_bytes(bytes(data))
    proc = check(genv, tampered)
    assert proc.returncode == 2 and "is not the subject of" in proc.stderr, proc.stderr
    # a changed statement inside the envelope (the signature no longer covers it)
    forged = forge(genv, tmp_path / "forged.intoto.jsonl")
    proc = check(forged, gwheel)
    assert proc.returncode == 2 and "no signature verifies" in proc.stderr, proc.stderr
    # another key
    (tmp_path / "other").mkdir()
    _, other = keypair(tmp_path / "other")
    proc = check(genv, gwheel, other)
    assert proc.returncode == 2 and "no signature verifies" in proc.stderr, proc.stderr
    assert verify_py.read_bytes() == (Path(dist_verify.__file__).read_bytes())


@pytest.mark.slow  # a package stage (about a second)
def test_both_verifiers_agree_on_every_input(tmp_path: Path):
    """verify.py (what dist/ ships) and tpfix.release.attest verify give the same
    verdict and exit status on each input: 0 for the signed wheel, also with
    a changed keyid (an unauthenticated hint in DSSE: a keyid names no key),
    2 for a changed wheel, a forged statement, another key, a missing file."""
    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    env = dist / f"{wheel.name}.intoto.jsonl"
    doc = json.loads(env.read_text())
    inputs = {"signed": (env, wheel, pub, 0)}
    rekeyed = json.loads(json.dumps(doc))
    rekeyed["signatures"][0]["keyid"] = "0" * 64
    (tmp_path / "rekeyed.intoto.jsonl").write_text(json.dumps(rekeyed))
    inputs["changed keyid"] = (tmp_path / "rekeyed.intoto.jsonl", wheel, pub, 0)
    tampered = tmp_path / wheel.name
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1
    tampered.write_bytes(bytes(data))
    inputs["changed wheel"] = (env, tampered, pub, 2)
    forged = json.loads(json.dumps(doc))
    stmt = json.loads(base64.b64decode(forged["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = _sha256(tampered)
    forged["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    (tmp_path / "forged.intoto.jsonl").write_text(json.dumps(forged))
    inputs["forged statement"] = (tmp_path / "forged.intoto.jsonl", tampered, pub, 2)
    (tmp_path / "other").mkdir()
    _, other = keypair(tmp_path / "other")
    inputs["another key"] = (env, wheel, other, 2)
    inputs["missing wheel"] = (env, tmp_path / "nope.whl", pub, 2)
    verify_py = [sys.executable, "-I", str(dist / "verify.py")]
    attest_verify = [sys.executable, "-m", "tpfix.release.attest", "verify"]
    for what, (envelope, artifact, key, status) in inputs.items():
        args = [str(envelope), "--key", str(key), "--artifact", str(artifact)]
        for tool in (verify_py, attest_verify):
            proc = subprocess.run([*tool, *args], capture_output=True, text=True)
            assert proc.returncode == status, (what, tool, proc.stdout, proc.stderr)
            assert "Traceback" not in proc.stderr, (what, tool, proc.stderr)


@pytest.mark.slow  # package stages (about a second each)
def test_a_signed_dist_is_signed_as_a_whole(tmp_path: Path):
    """With a key, SHA256SUMS.intoto.jsonl signs SHA256SUMS and every file it
    lists; verify.py --dist and attest verify-dist check every file and
    agree: the release engineer's probe (an SBOM edited and its SHA256SUMS
    line rewritten) and a changed file fail both; adding files needs the
    key; an unsigned build into the folder drops the old signature."""
    from tpfix.release import attest

    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    envelope = dist / attest.SUMS_ENVELOPE
    listed = sums(dist)
    assert attest.SUMS_ENVELOPE not in listed  # the one file it cannot list
    stmt = json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"]))
    assert stmt["predicateType"] == "https://in-toto.io/attestation/release/v0.1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    assert subjects == {"SHA256SUMS": sha(dist / "SHA256SUMS"), **listed}
    assert {wheel.name, f"{wheel.name}.cdx.json", "simple/vllm/index.html"} <= set(subjects)

    def verdicts() -> dict[str, tuple[int, str]]:
        return _both_verifiers(dist, pub)

    assert {k: v[0] for k, v in verdicts().items()} == {"verify.py": 0, "attest": 0}
    # the probe: drop a component from the SBOM, rewrite its SHA256SUMS line
    bom = dist / f"{wheel.name}.cdx.json"
    original, sums_before = bom.read_bytes(), (dist / "SHA256SUMS").read_bytes()
    doc = json.loads(original)
    doc["components"] = doc["components"][1:]
    bom.write_text(json.dumps(doc))
    (dist / "SHA256SUMS").write_text(sums_before.decode().replace(listed[bom.name], sha(bom)))
    for name, (code, text) in verdicts().items():
        assert code == 2 and "SHA256SUMS is not the one" in text, (name, text)
    (dist / "SHA256SUMS").write_bytes(sums_before)  # a changed file, SHA256SUMS as signed
    for name, (code, text) in verdicts().items():
        assert code == 2 and f"{bom} (sha256 {sha(bom)}) is not the file" in text, (name, text)
    bom.write_bytes(original)
    # adding files (the image's, an audit's) needs the key: without it nothing changes
    with pytest.raises(Fail, match=r"SHA256SUMS.intoto.jsonl signs this dist folder: give"):
        package.add_to_dist(dist, {Path("image/x.cdx.json"): "{}"})
    assert not (dist / "image").exists() and (dist / "SHA256SUMS").read_bytes() == sums_before
    package.add_to_dist(dist, {Path("image/x.cdx.json"): "{}"}, signer=attest.load_signer(priv))
    assert {k: v[0] for k, v in verdicts().items()} == {"verify.py": 0, "attest": 0}
    # an unsigned build into the folder: the old signature would not verify, it goes
    publish_small(tmp_path, version="0.27.1+tpfix.4")
    assert not envelope.exists()


@pytest.mark.slow  # a package stage (about a second)
def test_an_unsigned_dist_ships_no_verify_py(tmp_path: Path):
    dist, _, _, _ = publish_small(tmp_path)
    assert not (dist / "verify.py").exists()


@pytest.mark.slow  # a subprocess for the release artifacts
@pytest.mark.parametrize("kind", ["ecdsa-p256", "ecdsa-p384", "rsa"])
def test_verify_py_takes_every_key_type_attest_signs_with(tmp_path: Path, kind: str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    from tpfix.release import attest

    key = {
        "ecdsa-p256": lambda: ec.generate_private_key(ec.SECP256R1()),
        "ecdsa-p384": lambda: ec.generate_private_key(ec.SECP384R1()),
        "rsa": lambda: rsa.generate_private_key(65537, 3072),
    }[kind]()
    priv, pub = tmp_path / "key.pem", tmp_path / "key.pub.pem"
    priv.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    wheel = tmp_path / "x.whl"
    wheel.write_bytes(b"a wheel")
    subject = [{"name": wheel.name, "digest": {"sha256": _sha256(wheel)}}]
    doc = {"_type": attest.STATEMENT_TYPE, "predicateType": attest.PREDICATE_TYPE}
    payload = json.dumps({**doc, "subject": subject, "predicate": {}}).encode()
    env = tmp_path / "x.intoto.jsonl"
    env.write_text(attest.sign(payload, attest.load_signer(priv)))
    script = Path(dist_verify.__file__)
    cmd = [sys.executable, "-I", str(script), str(env), "--key", str(pub), "--artifact"]
    proc = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "y.whl").write_bytes(b"another wheel")
    proc = subprocess.run([*cmd, str(tmp_path / "y.whl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "is not the subject of" in proc.stderr, proc.stderr


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _both_verifiers(dist: Path, pub: Path) -> dict[str, tuple[int, str]]:
    """(exit status, output) of verify.py --dist and attest verify-dist."""
    tools = {
        "verify.py": [sys.executable, "-I", str(dist / "verify.py"), "--dist", str(dist)],
        "attest": [sys.executable, "-m", "tpfix.release.attest", "verify-dist", str(dist)],
    }
    out = {}
    for name, cmd in tools.items():
        proc = subprocess.run([*cmd, "--key", str(pub)], capture_output=True, text=True)
        assert "Traceback" not in proc.stderr, proc.stderr
        out[name] = (proc.returncode, proc.stdout + proc.stderr)
    return out


@pytest.mark.slow  # package stages and verifier subprocesses (a few seconds)
def test_a_file_sha256sums_does_not_list_is_refused_by_both_verifiers(tmp_path: Path):
    """The release engineer's probe: a fake torch wheel and its index page
    added to a signed dist (uv, asking our index first, took it), a hidden
    folder (a killed build's staging), a symbolic link (unlisted, and in a
    listed file's place): each alone makes both verifiers exit 2 naming it,
    with one `error:` line; the folder as built, and with another line's
    signed dist/<tag>/ inside it, passes."""
    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    assert {k: v[0] for k, v in _both_verifiers(dist, pub).items()} == {"verify.py": 0, "attest": 0}
    fake = "torch-2.13.0-py3-none-any.whl"
    plants = {  # what is planted (in a copy of the folder each): (where, what the error names)
        "an unlisted wheel": (fake, fake),
        "an index page": ("simple/torch/index.html", "simple/torch/"),
        "a hidden folder": (".staging-4242-abc/vllm.whl", ".staging-4242-abc/"),
        "a symbolic link": ("simple/vllm/latest.whl", "simple/vllm/latest.whl"),
    }
    for n, (what, (rel, named)) in enumerate(plants.items()):
        trial = shutil.copytree(dist, tmp_path / f"trial{n}", symlinks=True)
        path = trial / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if what == "a symbolic link":
            path.symlink_to(wheel)
        else:
            path.write_text(f'<a href="../../{fake}">{fake}</a>')
        for tool, (code, text) in _both_verifiers(trial, pub).items():
            assert code == 2, (what, tool, text)
            assert text.startswith("error: ") and len(text.splitlines()) == 1, (what, tool, text)
            assert f"{trial}/{named}: not listed in {trial / 'SHA256SUMS'}" in text, (what, text)
    # a listed file replaced by a link to the same bytes: refused too (it may
    # point anywhere, and change with what it points to)
    moved = tmp_path / "elsewhere.whl"
    shutil.move(wheel, moved)
    wheel.symlink_to(moved)
    for tool, (code, text) in _both_verifiers(dist, pub).items():
        assert code == 2 and f"{wheel}: not listed in" in text, (tool, text)
    wheel.unlink()
    shutil.move(moved, wheel)
    # another line's dist/<tag>/ inside: checked as a dist of its own, same key
    inner, _, _, _ = publish_small(tmp_path / "inner", key=priv)
    shutil.move(inner, dist / "v0.33.0")
    assert {k: v[0] for k, v in _both_verifiers(dist, pub).items()} == {"verify.py": 0, "attest": 0}
    (dist / "v0.33.0" / "simple" / "torch").mkdir()
    for tool, (code, text) in _both_verifiers(dist, pub).items():
        assert code == 2 and f"{dist / 'v0.33.0' / 'simple' / 'torch'}/: not listed" in text, text
