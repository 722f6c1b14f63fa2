# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 5: publish a verified wheel into dist/, with what describes it.

Beside the wheel, in the staging folder first (`describe`):
  <wheel>.cdx.json          CycloneDX SBOM (tpfix.release.sbom), schema-checked
  <wheel>.provenance.json   in-toto statement, SLSA v1 provenance (tpfix.release.attest)
  <wheel>.intoto.jsonl      the statement signed (DSSE), with --sign-key only
  verify.py                 checks it: python3 verify.py ENVELOPE --key PUB --artifact FILE
                            (Python + cryptography only; tpfix/release/dist_verify.py), signed only
  <wheel>.metadata          the wheel's METADATA (PEP 658), for the index
  simple/                   a static PEP 503 index of dist/ (tpfix.release.index)
  SHA256SUMS                every file above, in `sha256sum -c` form

`publish` moves the wheel, then each of them into dist/ from the staging
folder (<workdir>/staging-*, outside dist/: a server publishing dist/ never
serves it; os.replace, or a copy beside the file then os.replace where dist
is another file system), then writes SHA256SUMS (atomically too), then
removes what the old SHA256SUMS listed and the new one does not (an older
wheel's files, the image files of an older wheel).  It removes nothing
else: what no SHA256SUMS listed is kept and named in one warning line
(dist/.publishing names what a publish moves in, so that a killed one's
files are known as ours).  The wheel of the same version for the other
arch (./build.sh --arch aarch64 into the same dist) stays, with its files
and its image's (image/<name>-<arch>.*, image_arch), their envelopes
signed again where another key signed them: SHA256SUMS and simple/ list
both arches.  The image files of the arch built again stay only where its
wheel is byte for byte the one listed and the folder keeps its signer (a
cached rebuild); otherwise they go, and so does the manifest list over both
images (tpfix.image.image_list); its audit reports (dist_folder.AUDITS) stay where the
wheel and its SBOM are byte for byte the ones listed, else they go with a
note saying how to remake them.
So every file in dist/ is always whole, old bytes or new, never part of
either; SHA256SUMS changes only once all it lists is in place.  A run
killed between two moves leaves a mix of old and new files, which `sha256sum
-c SHA256SUMS` reports; the next build replaces it (tests/test_package.py
kills one at every step).
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from tpfix.core.context import BuildContext
from tpfix.core.lines import Line, get_line, line_names, wheel_arches
from tpfix.core.util import PARTIAL, Fail, add_sign_arg, link_or_copy, sha256_file, write_atomic
from tpfix.core.wheelfile import wheel_arch
from tpfix.stages.dist_folder import (
    PUBLISHING,
    SUMS_ENVELOPE,
    kept_audits,
    keyids,
    move_in,
    pending_moves,
    resign,
    signed_by,
    warn_foreign,
)

SUMS = "SHA256SUMS"
IMAGE = "image"  # dist's folder of the image files (tpfix.image.image)
STAGING = "staging-"  # <workdir>/staging-<pid>-*: outside dist/, never served
OLD_STAGING = ".staging-"  # dist/.staging-<pid>-*: where builds staged before
VERIFY = "verify.py"  # tpfix/release/dist_verify.py, shipped with a signed provenance


def describe(
    wheel: Path,
    ctx: BuildContext,
    sdist: Path,
    official: Path,
    arch: str,
    epoch: int,
    signer=None,
    others: list[Path] = (),
) -> list[Path]:
    """Write the SBOM, provenance (signed by `signer`, attest.signing_key) and
    index beside the staged `wheel`; returns them, relative to its folder.
    The index also lists `others`, the wheels of the other arches that stay
    in dist/ (other_arches), linked into the staging folder for it."""
    from tpfix.release import attest, dist_verify, index, sbom, wheel_sbom

    staging = wheel.parent
    out = []

    def write(name: str, text: str) -> None:
        (staging / name).write_text(text)
        out.append(Path(name))

    write(
        f"{wheel.name}.cdx.json",
        sbom.dumps(wheel_sbom.wheel_bom(wheel, ctx, sdist, official, epoch)),
    )
    external = {
        "command": attest.build_command(),
        "line": ctx.tag,
        "arch": arch,
        "version": ctx.version,
    }
    stmt = attest.dumps(
        attest.statement(
            "wheel",
            [(wheel.name, sha256_file(wheel))],
            external,
            attest.upstream_deps(ctx, sdist, official),
            epoch,
        )
    )
    write(f"{wheel.name}.provenance.json", stmt)
    if signer is not None:
        write(
            attest.signed_name(f"{wheel.name}.provenance.json"),
            attest.sign(stmt.encode(), signer),
        )
        # Whoever receives dist/ alone can check the envelope without this repository.
        shutil.copyfile(dist_verify.__file__, staging / VERIFY)
        out.append(Path(VERIFY))
    for other in others:
        link_or_copy(other, staging / other.name)  # a hard link where on one file system
        out.append(Path(other.name))
    out += index.write_index(staging, [wheel, *(staging / o.name for o in others)])
    return out


def write_sums(dist: Path, files: list[Path], signer=None) -> None:
    """dist/SHA256SUMS for `files` (relative to dist), written atomically, then
    signed by `signer` (attest.release_statement: SHA256SUMS.intoto.jsonl);
    unsigned, an older signature of the folder goes (it would not verify)."""
    from tpfix.release import attest

    entries = sorted((rel.as_posix(), sha256_file(dist / rel)) for rel in files)
    write_atomic(dist / SUMS, "".join(f"{digest}  {rel}\n" for rel, digest in entries))
    envelope = dist / attest.SUMS_ENVELOPE
    if signer is None:
        envelope.unlink(missing_ok=True)
    else:
        statement = attest.release_statement(dist / SUMS, entries)
        write_atomic(envelope, attest.sign(statement.encode(), signer))


def check_signer(dist: Path, signer) -> None:
    """Fail where dist/ is signed (SHA256SUMS.intoto.jsonl) and no signer is
    given: adding files would drop the folder's signature."""
    from tpfix.release import attest

    if signer is None and (dist / attest.SUMS_ENVELOPE).exists():
        raise Fail(
            f"{dist / attest.SUMS_ENVELOPE} signs this dist folder: give the signing key "
            f"(--sign-key KEY.pem or ${attest.SIGNING_KEY_ENV}) to add files to it"
        )


def add_to_dist(
    dist: Path,
    texts: dict[Path, str],
    also: list[Path] = (),
    replacing: Callable[[Path], bool] | None = None,
    signer=None,
) -> list[Path]:
    """Write `texts` ({path relative to dist: content}) into dist/, each
    atomically, then SHA256SUMS with them and the files `also` names added,
    signed again by `signer`; listed entries for which `replacing` is true
    and that are not among them leave the list and the folder (the image's
    files of an older build).  Returns the paths written.  A signed dist needs the signer:
    without it, nothing is written."""
    check_signer(dist, signer)
    for rel, text in texts.items():
        write_atomic(dist / rel, text)
    new = {*texts, *also}
    before = listed(dist)
    kept = [p for p in before if p not in new and not (replacing and replacing(p))]
    write_sums(dist, [*kept, *new], signer)
    for rel in set(before) - {*kept, *new}:  # replaced: gone, not left to verify
        (dist / rel).unlink(missing_ok=True)
    return [dist / rel for rel in texts]


def add_image_files(
    dist: Path,
    texts: dict[Path, str],
    statement: Path,
    archive: Path | None,
    replacing: Callable[[Path], bool] | None = None,
    signer=None,
) -> list[Path]:
    """add_to_dist for what tpfix.image.image describes an image (or the manifest
    list) with: `texts`, its provenance `statement` among them, signed by
    `signer` beside it (attest.signed_name), and its `archive` where that lies
    in dist/image/ (elsewhere, --image-dir, SHA256SUMS cannot list it)."""
    from tpfix.release import attest

    texts = dict(texts)
    if signer is not None:
        envelope = statement.with_name(attest.signed_name(statement.name))
        texts[envelope] = attest.sign(texts[statement].encode(), signer)
    in_dist = archive is not None and archive.parent.resolve() == (dist / IMAGE).resolve()
    also = [Path(IMAGE, archive.name)] if in_dist else []
    written = add_to_dist(dist, texts, also, replacing=replacing, signer=signer)
    return written + [dist / p for p in also]


def image_arch(rel: Path) -> str | None:
    """The arch of one arch's file in dist/image/: tpfix.image.image names them
    `<name>-<arch>.<suffix>` (.tar, .cdx.json, .provenance.json, .intoto.jsonl,
    and tpfix.audit.advisories' reports of its SBOM); None for the manifest list's
    files (`<name>.oci.tar`, ...: a tag holding `-<arch>.` is refused) and the
    rest."""
    return next((a for a in wheel_arches() if f"-{a}." in rel.name), None)


def image_name(tag: str, arch: str | None = None) -> str:
    """The name of an image's files in <dist>/image/: its tag's last part with
    `:` as `-`, then `-<arch>` for one arch's image (image_arch), none for the
    manifest list over all of them (tpfix.image.image_list)."""
    name = tag.rsplit("/", 1)[-1].replace(":", "-")
    return f"{name}-{arch}" if arch else name


def replaced_by_image(arch: str) -> Callable[[Path], bool]:
    """Which listed files a new image of `arch` replaces (add_to_dist): that
    arch's image files of an older build, and the manifest list's (it names
    the image being replaced); the other arch's image files stay."""
    return lambda rel: rel.parts[0] == IMAGE and image_arch(rel) in (arch, None)


_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")
_WHEEL_NAME = re.compile(r"^vllm-[^/]+\.whl$")


def read_sums(sums: Path) -> list[tuple[str, str, str]]:
    """(path, sha256, the line as written) of each entry of a `sha256sum` file
    ("<hex>  <relpath>", or "<hex> *<relpath>")."""
    out = []
    for n, line in enumerate(sums.read_text().splitlines(), 1):
        if not line.strip():
            continue
        m = _SUMS_LINE.match(line)
        if not m:
            raise Fail(f"{sums}, line {n}: not `<sha256>  <path>`: {line!r}; rerun ./build.sh")
        out.append((m.group(2), m.group(1).lower(), line))
    return out


def wheel_entry(sums: Path, arch: str | None = None) -> tuple[str, str, str]:
    """The top-level vllm-*.whl entry of SHA256SUMS for `arch` (None: the only
    one there is): (name, sha256, line).  A dist holds one wheel per arch."""
    entries = read_sums(sums)
    wheels = [e for e in entries if _WHEEL_NAME.match(e[0])]
    mine = [e for e in wheels if arch is None or wheel_arch(Path(e[0])) == arch]
    if len(mine) != 1:
        listed = ", ".join(e[0] for e in wheels) or f"none among {len(entries)} entries"
        what = "vllm wheels (vllm-*.whl)" + (f" for {arch}" if arch else "")
        fix = f"rerun ./build.sh --arch {arch}" if arch else "rerun ./build.sh"
        if arch is None and len(mine) > 1:
            fix = "one per arch: give --arch x86_64 or --arch aarch64"
        raise Fail(f"{sums} lists {len(mine)} {what}, expected exactly one ({listed}); {fix}")
    return mine[0]


def add_dist_step_args(ap, every_arch: bool = False) -> None:
    """The arguments of a step that adds files to a built dist folder
    (tpfix.audit.advisories, tpfix.audit.resolved_sbom): --line, --dist, --arch
    (`every_arch`: by default each wheel dist/ lists, find_wheels), --index-url
    and --sign-key; dist_step() reads them."""
    ap.add_argument("--line", choices=line_names(), help="release line (default: VERSION's)")
    ap.add_argument("--dist", type=Path, help="default dist/ (dist/TAG/ for another line)")
    default = "each one it lists" if every_arch else "its only one"
    ap.add_argument(
        "--arch", choices=wheel_arches(), help=f"the wheel of dist/ (default: {default})"
    )
    ap.add_argument("--index-url", help="the index uv resolves from (default: uv's own)")
    add_sign_arg(ap)


@contextlib.contextmanager
def dist_step(args, fix: str) -> Iterator[tuple[Line, Path, object]]:
    """(line, dist folder, signer) of add_dist_step_args' `args`, with the
    dist folder locked (`fix`: what to do while another build holds it) and
    checked to be signable: a signed folder needs the key before any work."""
    from tpfix.core.worklock import dist_lock
    from tpfix.release.attest import signing_key

    signer = signing_key(args.sign_key)
    line = get_line(args.line)
    dist = (args.dist or line.dist).resolve()
    with dist_lock(dist, fix):
        check_signer(dist, signer)
        yield line, dist, signer


def find_wheel(dist: Path, arch: str | None = None) -> tuple[Path, str]:
    """The wheel SHA256SUMS names for `arch` (None: its only wheel) and its
    sha256 (the in-build check repeats this)."""
    sums = dist / "SHA256SUMS"
    if not sums.exists():
        raise Fail(f"{sums} is missing: build the wheel first (./build.sh)")
    name, digest, _ = wheel_entry(sums, arch)
    if not (dist / name).exists():
        raise Fail(f"{dist / name} (listed in {sums}) is missing: rerun ./build.sh")
    return dist / name, digest


def find_wheels(dist: Path, arch: str | None = None) -> list[tuple[Path, str]]:
    """find_wheel for `arch`, or (None) for each arch of a wheel SHA256SUMS lists."""
    sums = dist / SUMS
    if arch is not None or not sums.exists():
        return [find_wheel(dist, arch)]
    arches = sorted({wheel_arch(Path(e[0])) for e in read_sums(sums) if _WHEEL_NAME.match(e[0])})
    return [find_wheel(dist, a) for a in arches] or [find_wheel(dist)]


def listed(dist: Path) -> list[Path]:
    """The files dist/SHA256SUMS lists, relative to dist (none without one)."""
    sums = dist / SUMS
    return [Path(e[0]) for e in read_sums(sums)] if sums.exists() else []


def other_arches(dist: Path, wheel: Path) -> list[Path]:
    """The wheels of `wheel`'s version for the other arches that dist/SHA256SUMS
    lists (relative to dist): published beside it, one index for all."""
    version = wheel.name.split("-")[1]
    return [
        p
        for p in listed(dist)
        if _WHEEL_NAME.match(p.as_posix())
        and p.name.split("-")[1] == version
        and wheel_arch(p) != wheel_arch(wheel)
        and (dist / p).is_file()
    ]


def publish(wheel: Path, dist: Path, extras: list[Path] = (), signer=None) -> Path:
    """Move the staged wheel and its `extras` (relative to its folder) into
    dist/; the files of the other arches' wheels of its version stay (its
    extras index them: describe), signed again by `signer` where another key
    signed them, an older version's go, and so do the image files of a wheel
    replaced by other bytes.  Only what a SHA256SUMS listed (or a killed
    publish was moving in) is ever removed; anything else is kept and named."""
    staging = wheel.parent
    dist.mkdir(parents=True, exist_ok=True)
    listed_sha = {e[0]: e[1] for e in read_sums(dist / SUMS)} if (dist / SUMS).exists() else {}
    listed, pending = {Path(p) for p in listed_sha}, pending_moves(dist)
    others = {p.name for p in extras if p.suffix == ".whl"}
    kept = [p for p in listed if p.name in others or p.name.split(".whl.")[0] + ".whl" in others]
    # Image files stay with the wheel they were built from: the other arches'
    # (kept above), and this arch's too where its wheel is byte for byte the
    # one listed and signed by the same key, or unsigned as before (a cached
    # rebuild: their envelopes are still this folder's signer's); the
    # manifest list only if all it names stays.
    same_signer = signed_by(dist / SUMS_ENVELOPE) == keyids(signer)
    same_wheel = listed_sha.get(wheel.name) == sha256_file(wheel)
    unchanged = same_wheel and same_signer
    arches = {wheel_arch(Path(name)) for name in others} | (
        {wheel_arch(wheel)} if unchanged else set()
    )
    images = [p for p in listed if p.parts[0] == IMAGE]
    whole = unchanged and {image_arch(p) for p in images} - {None} <= arches
    kept += [p for p in images if image_arch(p) in arches or (whole and image_arch(p) is None)]
    bom = f"{wheel.name}.cdx.json"
    same_bom = same_wheel and listed_sha.get(bom) == sha256_file(staging / bom)
    kept += kept_audits(dist, wheel, listed_sha, set(extras), same_bom)
    resigned = resign(dist, staging, kept, signer)
    moved = [Path(wheel.name), *(p for p in extras if p.name not in others), *resigned]
    write_atomic(dist / PUBLISHING, "".join(f"{p.as_posix()}\n" for p in moved))
    for rel in moved:
        move_in(staging / rel, dist / rel)
    now = sorted({*moved, *extras, *kept})
    write_sums(dist, now, signer)
    for rel in (listed | pending) - set(now):
        (dist / rel).unlink(missing_ok=True)
    (dist / PUBLISHING).unlink()
    warn_foreign(dist, now)
    return dist / wheel.name


def _legacy_staging(dist: Path) -> list[Path]:
    # Where builds before dist/.staging-* staged (beside dist), left by a kill.
    return list(dist.parent.glob(f".{dist.name}-staging.*"))


def clear_staging(dist: Path) -> None:
    """Remove what killed runs of this project left in `dist` (the caller
    holds its lock): staging folders of builds that staged in dist/
    (OLD_STAGING, or beside it) and an old index one of them killed between
    its two renames left (dist/.simple.old), and the temporary file of a
    write killed before its rename (util.write_atomic, publish's copy across
    file systems: SHA256SUMS, the image's files; image_engine: its
    archives), in dist/, dist/image/ and the folders SHA256SUMS lists files
    in.  The image stage runs it too."""
    for stale in [*dist.glob(OLD_STAGING + "*"), dist / ".simple.old", *_legacy_staging(dist)]:
        shutil.rmtree(stale, ignore_errors=True)
    folders = {dist, dist / IMAGE}  # image/: where the image stage writes, listed or not
    with contextlib.suppress(Fail):  # an unreadable SHA256SUMS: the build rewrites it
        folders |= {dist / rel.parent for rel in listed(dist)}
    for folder in folders:
        for partial in folder.glob(f".*{PARTIAL}*"):
            if partial.is_dir():  # image_engine.save_list's layout
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)
