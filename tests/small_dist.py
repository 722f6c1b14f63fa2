# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A small dist/ for the tests of the package stage, the provenance, the SBOM
and the advisories: the package stage (tpfix.stages.package.describe + publish, the
real code) on a tiny wheel made here, with two small files standing in for the
upstream sdist and official wheel (only their sha256 goes into the documents)
and the default line's real series; and the checks an operator runs on it."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from wheels import make_wheel

from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line
from tpfix.release import attest
from tpfix.stages import package

SIDE = (".cdx.json", ".provenance.json", ".metadata")


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def sums(dist: Path) -> dict[str, str]:
    lines = (dist / "SHA256SUMS").read_text().splitlines()
    return {ln.split("  ", 1)[1]: ln.split("  ", 1)[0] for ln in lines}


def check_sums(dist: Path) -> None:
    """`sha256sum -c` (the coreutils tool an operator runs) accepts SHA256SUMS."""
    proc = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=dist, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def keypair(folder: Path, password: bytes | None = None) -> tuple[Path, Path]:
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


def publish_small(
    tmp: Path,
    version: str = "0.27.1+tpfix.3",
    key: Path | None = None,
    arch: str | None = None,
    requires: tuple[str, ...] | None = None,
):
    """The package stage on a tiny wheel: returns (dist, wheel, sdist, official).
    With `arch`, the wheel is named for it as ./build.sh --arch names ours, and
    published beside the other arch's wheel of its version, as the pipeline does.
    `requires`: its Requires-Dist (default make_wheel's)."""
    staging, dist = tmp / "staging", tmp / "dist"
    wheel = make_wheel(staging, version, **({} if requires is None else {"requires": requires}))
    if arch is not None:
        wheel = wheel.rename(staging / f"vllm-{version}-cp38-abi3-manylinux_2_28_{arch}.whl")
    sdist, official = tmp / "vllm-0.27.1.tar.gz", tmp / "vllm-0.27.1-py3-none-any.whl"
    sdist.write_bytes(b"stand-in for the pinned sdist")
    official.write_bytes(b"stand-in for the official wheel")
    signer = attest.load_signer(key) if key else None
    others = [dist / p for p in package.other_arches(dist, wheel)]
    extras = package.describe(
        wheel,
        BuildContext.resolve(get_line()),
        sdist,
        official,
        arch or "x86_64",
        "1700000000",
        signer,
        others,
    )
    final = package.publish(wheel, dist, extras, signer)
    return dist, final, sdist, official


def statement(path: Path) -> dict:
    """The statement, parsed back through in-toto-attestation's own validator."""
    data = json.loads(path.read_text())
    pb = json_format.ParseDict(data, statement_pb2.Statement())
    Statement.copy_from_pb(pb).validate()
    return data


def sums_dist(folder: Path, wheel_name: str, wheel_bytes: bytes, extra: int = 0) -> Path:
    """dist/ as ./build.sh writes it, by hand: `wheel_name` holding
    `wheel_bytes`, its SBOM, provenance and index pages, all in SHA256SUMS;
    `extra`: that many more vllm wheels (an error for the image stage)."""
    files = {
        wheel_name: wheel_bytes,
        f"{wheel_name}.cdx.json": b'{"bomFormat": "CycloneDX"}\n',
        f"{wheel_name}.provenance.json": b'{"_type": "https://in-toto.io/Statement/v1"}\n',
        "simple/vllm/index.html": f'<a href="../../{wheel_name}">{wheel_name}</a>\n'.encode(),
        "simple/index.html": b'<a href="vllm/">vllm</a>\n',
    }
    for i in range(extra):  # a second vllm wheel: an error
        files[wheel_name.replace("-cp38-", f"-cp3{9 + i}-")] = wheel_bytes
    lines = []
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
    (folder / "SHA256SUMS").write_text("".join(lines))
    return folder


def forge(envelope: Path, dest: Path) -> Path:
    """`envelope` (DSSE) with its statement's first subject changed and its
    signature kept, which then no longer covers it, written to `dest`."""
    doc = json.loads(envelope.read_text())
    stmt = json.loads(base64.b64decode(doc["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = "0" * 64
    doc["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    dest.write_text(json.dumps(doc))
    return dest
