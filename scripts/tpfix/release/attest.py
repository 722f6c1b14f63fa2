# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Provenance: an in-toto Statement v1 with a SLSA v1 provenance predicate.

For the wheel (`<wheel>.provenance.json`) and the image
(`<image>.provenance.json`), built with in-toto-attestation's bindings:
  * subject: the artifact's file name and sha256 (the image: its config digest);
  * buildDefinition: our build type, the command line (less the options
    that only name output folders or the key) and the line, arch and VERSION
    as external parameters; SOURCE_DATE_EPOCH and the build tools'
    versions as internal ones; as resolved dependencies the pinned sdist
    and official wheel, every patch of the series (sha256 of each file) and,
    for the image, the base image and the wheel;
  * runDetails.builder: this repository at its commit (`-dirty` with
    uncommitted changes), as a builder dependency with its gitCommit digest.
No start/finish times: the statement is byte-reproducible like the wheel.

With a key, the dist folder as a whole is signed too: SHA256SUMS.intoto.jsonl,
an in-toto release statement (release_statement) whose subjects are
SHA256SUMS and every file it lists (wheels, SBOMs, provenance, PEP 658
metadata, index pages, image files), rewritten whenever SHA256SUMS is.

This is provenance a build writes about itself (SLSA Build L1); signed with
a key the operator holds, it says who vouches for it.  Signing (DSSE, the
envelope in-toto and SLSA use) takes a PEM private key (ed25519, ECDSA or
RSA) and writes `<artifact>.intoto.jsonl`; keyless signing needs an OIDC
identity and a transparency log, neither reachable from this build.

    python -m tpfix.release.attest sign STATEMENT --key PRIVATE.pem   # -> STATEMENT's .intoto.jsonl
    python -m tpfix.release.attest verify ENVELOPE --key PUBLIC.pem --artifact FILE
    python -m tpfix.release.attest verify-dist DIST --key PUBLIC.pem   # SHA256SUMS.intoto.jsonl
    python -m tpfix.release.attest verify ENVELOPE --key PUBLIC.pem --signature-only

verify exits 0 only once the artifact is checked too, or with --signature-only
(which says so on stdout).  Without this repository: dist/verify.py (the
same check, Python + cryptography only; tpfix/release/dist_verify.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path

from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2 as slsa
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from tpfix.core.context import BuildContext
from tpfix.core.util import (
    ROOT,
    Fail,
    main_wrapper,
    revision,
    sha256_file,
    source_url,
    write_atomic,
)

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "urn:tpfix:build-type:{}:v1"  # wheel, image
BUILDER_ID = "urn:tpfix:builder:build.sh"
SIGNING_KEY_ENV = "TPFIX_SIGNING_KEY"
PASSWORD_ENV = "TPFIX_SIGNING_KEY_PASSWORD"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


def resource_descriptor(name: str, digest: str, uri: str = "", **annotations) -> ResourceDescriptor:
    """A resource descriptor with a sha256 digest (`sha256:` prefix optional)."""
    return ResourceDescriptor(
        name=name,
        uri=uri,
        digest={"sha256": digest.removeprefix("sha256:")},
        annotations=annotations or None,
    )


def file_dep(path: Path, uri: str = "", **annotations: str) -> ResourceDescriptor:
    return resource_descriptor(path.name, sha256_file(path), uri, **annotations)


def upstream_deps(ctx: BuildContext, sdist: Path, official: Path) -> list[ResourceDescriptor]:
    """The pinned upstream files and each patch of the context's series."""
    line = ctx.line
    version = line.tag.removeprefix("v")
    out = [
        file_dep(sdist, f"pkg:pypi/vllm@{version}?file_name={sdist.name}"),
        file_dep(official, f"pkg:pypi/vllm@{version}?file_name={official.name}"),
    ]
    for name in ctx.series:
        path = line.patches / name
        out.append(
            resource_descriptor(
                path.relative_to(ROOT).as_posix(), sha256_file(path), series=line.tag
            )
        )
    return out


def _tools() -> dict[str, str]:
    names = ["setuptools", "setuptools-scm", "wheel", "torch", "cyclonedx-python-lib"]
    out = {"python": platform.python_version()}
    for n in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[n] = metadata.version(n)
    return out


def statement(
    kind: str,
    subjects: list[tuple[str, str]],
    external: dict,
    deps: list[ResourceDescriptor],
    epoch: str | int,
) -> dict:
    """The statement about `subjects` ((name, sha256) each) as a plain dict
    (in-toto-attestation validates it)."""
    commit = revision()
    head = commit.removesuffix("-dirty")
    # The origin remote without credentials; none for a local path (it would
    # differ per checkout).
    builder_dep = ResourceDescriptor(
        name="vllm-tpfix",
        uri=f"git+{source_url()}@{head}" if source_url() else "",
        digest={"gitCommit": head},
        annotations={"dirty": True} if commit != head else None,
    )
    internal = {"SOURCE_DATE_EPOCH": str(epoch), "tools": _tools()}
    prov = slsa.Provenance(
        build_definition=slsa.BuildDefinition(
            build_type=BUILD_TYPE.format(kind),
            resolved_dependencies=[d.pb for d in deps],
        ),
        run_details=slsa.RunDetails(
            builder=slsa.Builder(id=BUILDER_ID, builder_dependencies=[builder_dep.pb]),
        ),
    )
    prov.build_definition.external_parameters.update(external)
    prov.build_definition.internal_parameters.update(internal)
    subject = [resource_descriptor(name, digest).pb for name, digest in subjects]
    stmt = Statement(subject, PREDICATE_TYPE, json_format.MessageToDict(prov))
    stmt.validate()
    for d in deps:
        d.validate()
    return json_format.MessageToDict(stmt.pb)


# Options that only say where outputs go: they cannot change a byte of an
# artifact, and left in they would make the statement differ per folder.
_OUTPUT_OPTIONS = ("--dist", "--workdir", "--image-dir", "--sign-key")


def build_command(argv: list[str] | None = None) -> str:
    """How this build was started (build.sh runs tpfix.pipeline with its
    arguments; `python -m tpfix.image` builds an image alone), less the output
    folders, the signing key's path and --no-cache (the same bytes either way)."""
    argv = sys.argv if argv is None else argv
    path = Path(argv[0])
    prog = ["./build.sh"]
    if path.name not in ("pipeline.py", "build.sh"):  # a module of scripts/: its dotted name
        module = path.resolve().with_suffix("")
        module = module.parent if module.name == "__main__" else module  # a package's
        scripts = ROOT / "scripts"
        name = ".".join(module.relative_to(scripts).parts) if module.is_relative_to(scripts) else ""
        prog = ["python", "-m", name or f"tpfix.{path.stem}"]
    args, out = list(argv[1:]), []
    while args:
        a = args.pop(0)
        if a in _OUTPUT_OPTIONS:
            args = args[1:]
        elif a == "--no-cache":
            continue
        elif not a.startswith(tuple(o + "=" for o in _OUTPUT_OPTIONS)):
            out.append(a)
    return shlex.join([*prog, *out])


def dumps(stmt: dict) -> str:
    return json.dumps(stmt, indent=2, sort_keys=True) + "\n"


# The signature of a dist folder as a whole: an in-toto release statement whose
# subjects are SHA256SUMS and every file it lists (wheels, SBOMs, provenance,
# PEP 658 metadata, index pages, image files), signed beside it as
# SHA256SUMS.intoto.jsonl (the one published file SHA256SUMS cannot list).
RELEASE_PREDICATE = "https://in-toto.io/attestation/release/v0.1"
SUMS_ENVELOPE = "SHA256SUMS.intoto.jsonl"


def release_statement(sums: Path, listed: list[tuple[str, str]]) -> str:
    """The release statement of a dist folder: its SHA256SUMS file `sums` and
    the (path, sha256) of each file it lists (package.read_sums), as it stands."""
    subjects = [(sums.name, sha256_file(sums)), *listed]
    versions = sorted({p.split("-")[1] for p, _ in listed if p.startswith("vllm-")})
    stmt = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": d}} for n, d in subjects],
        "predicateType": RELEASE_PREDICATE,
        "predicate": {
            "purl": [f"pkg:pypi/vllm@{v}" for v in versions],
            "releaseId": "+".join(versions),
        },
    }
    return dumps(stmt)


# --- signing (DSSE) ------------------------------------------------------------


def load_signer(key: Path):
    """A signer of the PEM private key `key` (passphrase: $TPFIX_SIGNING_KEY_PASSWORD)."""
    try:
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        from securesystemslib.signer import CryptoSigner
    except ImportError as e:
        raise Fail(
            f"signing needs securesystemslib[crypto] ({e}): ./build.sh installs it"
        ) from None
    pw = os.environ.get(PASSWORD_ENV)
    try:
        private = load_pem_private_key(key.read_bytes(), password=pw.encode() if pw else None)
        return CryptoSigner(private)
    except (OSError, ValueError, TypeError) as e:
        raise Fail(
            f"signing key {key}: {e}; give a PEM private key (ed25519, ECDSA or RSA) "
            f"with --sign-key or ${SIGNING_KEY_ENV}, its passphrase in ${PASSWORD_ENV} "
            "if it has one"
        ) from None


def sign(payload: bytes, signer) -> str:
    """A DSSE envelope over `payload` (one JSON line, the .intoto.jsonl form)."""
    from securesystemslib.dsse import Envelope

    env = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    env.sign(signer)
    return json.dumps(env.to_dict(), sort_keys=True) + "\n"


def verify(envelope: Path, public_key: Path, artifact: Path | None = None) -> dict:
    """Check the envelope's signature with `public_key` (PEM) and, given the
    artifact, that it is the statement's subject; returns the statement."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import UnverifiedSignatureError, VerificationError
    from securesystemslib.signer import Signature, SSlibKey

    try:
        env = Envelope.from_dict(json.loads(envelope.read_text()))
        key = SSlibKey.from_crypto(load_pem_public_key(public_key.read_bytes()))
    except (OSError, ValueError, KeyError) as e:
        raise Fail(f"cannot read {envelope} or {public_key}: {e}") from None
    if env.payload_type != PAYLOAD_TYPE:
        raise Fail(f"{envelope}: payload type {env.payload_type!r}, expected {PAYLOAD_TYPE}")
    # A signature's keyid is an unauthenticated hint (DSSE; securesystemslib's
    # Envelope.verify skips signatures whose keyid differs): check each with the key.
    for sig in env.signatures.values():
        with contextlib.suppress(UnverifiedSignatureError, VerificationError):
            key.verify_signature(Signature(key.keyid, sig.signature), env.pae())
            break
    else:
        raise Fail(f"{envelope}: no signature verifies with {public_key}")
    stmt = json.loads(env.payload)
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
        raise Fail(f"{envelope}: not an in-toto v1 statement with a SLSA v1 provenance")
    if artifact is not None:
        try:
            digest = sha256_file(artifact)
        except OSError as e:  # missing, a folder, unreadable
            raise Fail(
                f"--artifact {artifact}: cannot read it ({e.strerror}); give the file "
                f"the provenance is about (e.g. the wheel beside {envelope.name})"
            ) from None
        subjects = [s["digest"].get("sha256") for s in stmt["subject"]]
        if digest not in subjects:
            raise Fail(f"{artifact} (sha256 {digest}) is not the subject of {envelope}")
    return stmt


def signed_name(statement_name: str) -> str:
    return statement_name.removesuffix(".provenance.json") + ".intoto.jsonl"


def signing_key(given: Path | None):
    """The signer of --sign-key, else of $TPFIX_SIGNING_KEY, else None (an
    unsigned statement only).  Loaded once, before anything is built, so a bad
    key stops the build at once; both variables are then removed from this
    process's environment, so that no build step (upstream's setup.py
    included) sees the key's path or its passphrase."""
    env_key = os.environ.pop(SIGNING_KEY_ENV, None)
    key = given or (Path(env_key) if env_key else None)
    try:
        return load_signer(key) if key is not None else None
    finally:
        os.environ.pop(PASSWORD_ENV, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sign", help="sign a statement (writes <artifact>.intoto.jsonl beside it)")
    s.add_argument("statement", type=Path)
    s.add_argument("--key", type=Path, required=True, help="PEM private key")
    v = sub.add_parser("verify", help="verify a signed statement")
    v.add_argument("envelope", type=Path)
    v.add_argument("--key", type=Path, required=True, help="PEM public key")
    v.add_argument("--artifact", type=Path, help="the file that must be the statement's subject")
    v.add_argument(
        "--signature-only",
        action="store_true",
        help="check the signature alone, not that an artifact is its subject",
    )
    d = sub.add_parser("verify-dist", help="verify every file of a signed dist folder")
    d.add_argument("dist", type=Path)
    d.add_argument("--key", type=Path, required=True, help="PEM public key")
    args = ap.parse_args()
    if args.cmd == "verify-dist":
        # the same check as the verify.py shipped in dist/ (tpfix/release/dist_verify.py)
        from tpfix.release import dist_verify

        try:
            files = dist_verify.verify_dist(str(args.dist), str(args.key))
        except dist_verify.Refused as e:
            raise Fail(str(e)) from None
        print(f"{args.dist}: signature OK; {len(files)} files, each as SHA256SUMS lists it")
        return
    if args.cmd == "verify" and (args.artifact is None) == (not args.signature_only):
        raise Fail(
            f"{args.envelope}: give --artifact FILE (the file the provenance is about), "
            "or --signature-only to check the signature alone"
            if args.artifact is None
            else "--artifact and --signature-only exclude each other: give one"
        )
    if args.cmd == "sign":
        out = args.statement.with_name(signed_name(args.statement.name))
        write_atomic(out, sign(args.statement.read_bytes(), load_signer(args.key)))
        print(out)
    else:
        stmt = verify(args.envelope, args.key, args.artifact)
        subj = ", ".join(f"{s['name']} sha256:{s['digest']['sha256']}" for s in stmt["subject"])
        if args.artifact is None:
            print(f"{args.envelope}: signature OK (signature only: no artifact checked); {subj}")
        else:
            print(f"{args.envelope}: signature OK; {args.artifact} is its subject {subj}")
        deps = stmt["predicate"]["buildDefinition"].get("resolvedDependencies", [])
        for d in deps:
            print(f"  built from {d.get('name')} sha256:{d['digest'].get('sha256')}")


if __name__ == "__main__":
    main_wrapper(main)
