#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Check a signed vllm-tpfix provenance with nothing but Python and `cryptography`.

    python3 verify.py ENVELOPE --key PUBLIC.pem --artifact FILE

ENVELOPE is a DSSE envelope (`<artifact>.intoto.jsonl`) over an in-toto v1
statement with a SLSA v1 provenance; PUBLIC.pem the signer's public key
(ed25519, ECDSA or RSA, PEM).  Exit 0 only when a signature of the envelope
verifies with the key AND FILE's sha256 is a subject of the statement; any
other outcome exits 2 with one `error:` line, as tpfix.attest verify does.
A signature's `keyid` is an unauthenticated hint (DSSE): every signature is
checked with the key, whatever keyid it names.  Requires Python 3.8+ and
`pip install cryptography`; nothing of the vllm-tpfix repository.

The build ships this file as dist/verify.py (tpfix/dist_verify.py in the
repository), beside the envelope it checks; tpfix.attest verify does the same
check with the repository's tools.
"""

import argparse
import base64
import hashlib
import json
import sys

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"


class Refused(Exception):
    pass


def pae(payload_type, payload):
    """DSSE v1 pre-authentication encoding: what the signature is over."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def b64(text):
    text = text.strip()
    pad = "=" * (-len(text) % 4)
    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(text + pad)
    return base64.b64decode(text + pad, validate=True)


def signature_ok(key, message, sig):
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(sig, message)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            digest = {256: hashes.SHA256, 384: hashes.SHA384}.get(key.curve.key_size, hashes.SHA512)
            key.verify(sig, message, ec.ECDSA(digest()))
        elif isinstance(key, rsa.RSAPublicKey):
            pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.AUTO)
            try:
                key.verify(sig, message, pss, hashes.SHA256())
            except InvalidSignature:
                key.verify(sig, message, padding.PKCS1v15(), hashes.SHA256())
        else:
            raise Refused(f"unsupported key type {type(key).__name__}") from None
    except InvalidSignature:
        return False
    return True


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(envelope, public_key, artifact):
    """The statement, once signature and subject are checked; Refused otherwise."""
    try:
        from cryptography.hazmat.primitives.serialization import load_pem_public_key
    except ImportError:
        raise Refused(
            "this check needs the `cryptography` package: pip install cryptography"
        ) from None
    try:
        with open(envelope, encoding="utf-8") as f:
            env = json.loads(f.read())
        payload = b64(env["payload"])
        payload_type = env["payloadType"]
        sigs = [b64(s["sig"]) for s in env["signatures"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"{envelope}: not a readable DSSE envelope ({e})") from None
    try:
        with open(public_key, "rb") as f:
            key = load_pem_public_key(f.read())
    except (OSError, ValueError, TypeError) as e:
        raise Refused(f"{public_key}: not a PEM public key ({e})") from None
    if payload_type != PAYLOAD_TYPE:
        raise Refused(f"{envelope}: payload type {payload_type!r}, expected {PAYLOAD_TYPE}")
    message = pae(payload_type, payload)
    if not any(signature_ok(key, message, s) for s in sigs):
        raise Refused(f"{envelope}: no signature verifies with {public_key}")
    try:
        stmt = json.loads(payload)
        subjects = [s["digest"].get("sha256") for s in stmt["subject"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise Refused(f"{envelope}: the signed payload is not an in-toto statement ({e})") from None
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
        raise Refused(f"{envelope}: not an in-toto v1 statement with a SLSA v1 provenance")
    try:
        digest = sha256_file(artifact)
    except OSError as e:
        raise Refused(f"{artifact}: cannot read it ({e.strerror})") from None
    if digest not in subjects:
        raise Refused(f"{artifact} (sha256 {digest}) is not the subject of {envelope}")
    return stmt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("envelope", help="the signed provenance, <artifact>.intoto.jsonl")
    ap.add_argument("--key", required=True, help="the signer's PEM public key")
    ap.add_argument("--artifact", required=True, help="the file the provenance is about")
    args = ap.parse_args()
    try:
        stmt = verify(args.envelope, args.key, args.artifact)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    names = ", ".join(s.get("name", "?") for s in stmt["subject"])
    print(f"OK: {args.artifact} is the signed subject of {args.envelope} ({names})")


if __name__ == "__main__":
    main()
