#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Check a signed vllm-tpfix provenance with nothing but Python and `cryptography`.

    python3 verify.py ENVELOPE --key PUBLIC.pem --artifact FILE
    python3 verify.py --dist DIR --key PUBLIC.pem      # every file of a dist folder

ENVELOPE is a DSSE envelope (`<artifact>.intoto.jsonl`) over an in-toto v1
statement with a SLSA v1 provenance; PUBLIC.pem the signer's public key
(ed25519, ECDSA or RSA, PEM).  Exit 0 only when a signature of the envelope
verifies with the key AND FILE's sha256 is a subject of the statement.  With
--dist: DIR/SHA256SUMS.intoto.jsonl (an in-toto release statement) verifies
with the key, its subjects are DIR/SHA256SUMS and exactly the files it lists,
at the digests it lists, every one of those files has that sha256, and DIR
holds nothing else: no file, folder or link SHA256SUMS does not list (its
signature aside), hidden ones included, as a web server publishing DIR would
serve it (a sub-folder with its own SHA256SUMS, another line's dist/<tag>/,
is checked the same way with the same key); any other outcome exits 2
with one `error:` line, as tpfix.release.attest verify does.
A signature's `keyid` is an unauthenticated hint (DSSE): every signature is
checked with the key, whatever keyid it names.  Requires Python 3.8+ and
`pip install cryptography`; nothing of the vllm-tpfix repository.

The build ships this file as dist/verify.py (tpfix/release/dist_verify.py in the
repository), beside the envelope it checks; tpfix.release.attest verify does the same
check with the repository's tools.
"""

import argparse
import base64
import hashlib
import json
import os
import sys

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
RELEASE_PREDICATE = "https://in-toto.io/attestation/release/v0.1"
SUMS, SUMS_ENVELOPE = "SHA256SUMS", "SHA256SUMS.intoto.jsonl"


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


def signed_statement(envelope, public_key, predicate_type=PREDICATE_TYPE):
    """The statement of `envelope` once a signature verifies with the key and
    it is an in-toto v1 statement of `predicate_type`; Refused otherwise."""
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
    if not subjects:
        raise Refused(f"{envelope}: the signed statement has no subject")
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != predicate_type:
        raise Refused(f"{envelope}: not an in-toto v1 statement of {predicate_type}")
    return stmt


def verify(envelope, public_key, artifact):
    """The statement, once signature and subject are checked; Refused otherwise."""
    stmt = signed_statement(envelope, public_key)
    subjects = [s["digest"].get("sha256") for s in stmt["subject"]]
    try:
        digest = sha256_file(artifact)
    except OSError as e:
        raise Refused(f"{artifact}: cannot read it ({e.strerror})") from None
    if digest not in subjects:
        raise Refused(f"{artifact} (sha256 {digest}) is not the subject of {envelope}")
    return stmt


def unlisted(folder, names):
    """(what `folder` holds that the SHA256SUMS entries `names` do not list, the
    nested dist folders in it), each relative to `folder`, sorted.  Unlisted:
    every file, folder and symbolic link (even one by a listed name) but
    SHA256SUMS and its signature; nested: a sub-folder that leads to no listed
    file and holds its own SHA256SUMS (another line's dist/<tag>/)."""
    names = set(names)
    parents = {os.path.dirname(n) for n in names}
    parents |= {p for n in parents for p in _ancestors(n)}
    extra, nested = [], []
    for root, dirs, files in os.walk(folder):
        at = os.path.relpath(root, folder)
        at = "" if at == "." else at
        for d in sorted(dirs):
            rel, path = os.path.join(at, d), os.path.join(root, d)
            if os.path.islink(path) or rel not in parents:
                dirs.remove(d)
                if not os.path.islink(path) and os.path.isfile(os.path.join(path, SUMS)):
                    nested.append(rel)
                else:
                    extra.append(rel + ("" if os.path.islink(path) else "/"))
        for f in files:
            rel = os.path.join(at, f)
            if os.path.islink(os.path.join(root, f)) or (
                rel not in names and rel not in (SUMS, SUMS_ENVELOPE)
            ):
                extra.append(rel)
    return sorted(extra), sorted(nested)


def _ancestors(rel):
    while rel:
        rel = os.path.dirname(rel)
        yield rel


def verify_dist(folder, public_key):
    """The files of a dist folder that its signed SHA256SUMS covers, once every
    one is checked and the folder holds nothing else (see the module's doc);
    Refused otherwise."""
    envelope = os.path.join(folder, SUMS_ENVELOPE)
    if not os.path.isfile(envelope):
        raise Refused(f"{envelope} is missing: the folder is not signed (./build.sh --sign-key)")
    stmt = signed_statement(envelope, public_key, RELEASE_PREDICATE)
    signed = {s.get("name"): s["digest"].get("sha256") for s in stmt["subject"]}
    sums = os.path.join(folder, SUMS)
    try:
        listed = {}
        with open(sums, encoding="utf-8") as f:
            for line in f.read().splitlines():
                digest, _, name = line.partition("  ")
                listed[name.lstrip("*")] = digest.lower()
    except OSError as e:
        raise Refused(f"{sums}: cannot read it ({e.strerror})") from None
    if sha256_file(sums) != signed.pop(SUMS, None):
        raise Refused(f"{sums} is not the one {envelope} signs")
    if listed != signed:
        diff = sorted(set(listed.items()) ^ set(signed.items()))
        raise Refused(f"{sums} does not list what {envelope} signs: {diff[:5]}")
    extra, nested = unlisted(folder, listed)
    if extra:
        shown = ", ".join(os.path.join(folder, e) for e in extra[:5])
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise Refused(
            f"{shown}{more}: not listed in {sums}, so not signed, yet served with the folder; "
            f"move {'it' if len(extra) == 1 else 'them'} out of {folder} (or rebuild into an "
            "empty folder)"
        )
    for name, digest in sorted(listed.items()):
        path = os.path.join(folder, name)
        try:
            got = sha256_file(path)
        except OSError as e:
            raise Refused(f"{path}: cannot read it ({e.strerror})") from None
        if got != digest:
            raise Refused(f"{path} (sha256 {got}) is not the file {envelope} signs ({digest})")
    inner = [
        os.path.join(n, f) for n in nested for f in verify_dist(os.path.join(folder, n), public_key)
    ]
    return sorted([*listed, *inner])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("envelope", nargs="?", help="the signed provenance, <artifact>.intoto.jsonl")
    ap.add_argument("--key", required=True, help="the signer's PEM public key")
    ap.add_argument("--artifact", help="the file the provenance is about")
    ap.add_argument("--dist", help="check every file of this dist folder instead")
    args = ap.parse_args()
    if (args.dist is None) == (args.envelope is None) or (args.envelope is None) != (
        args.artifact is None
    ):
        ap.error("give ENVELOPE --artifact FILE, or --dist DIR")
    try:
        if args.dist is not None:
            files = verify_dist(args.dist, args.key)
            print(f"OK: {len(files)} files of {args.dist} are the ones its signed SHA256SUMS lists")
            return
        stmt = verify(args.envelope, args.key, args.artifact)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    names = ", ".join(s.get("name", "?") for s in stmt["subject"])
    print(f"OK: {args.artifact} is the signed subject of {args.envelope} ({names})")


if __name__ == "__main__":
    main()
