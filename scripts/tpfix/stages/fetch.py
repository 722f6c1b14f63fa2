# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 1: fetch the pinned upstream artifacts with pip and verify their sha256.

Artifacts land in <cache>/sha256/<hex>/<filename> (cache: $VLLM_DIST_CACHE or
~/.cache/vllm-dist), so a second run downloads nothing.  pip downloads with
--require-hashes into a private temporary folder; only a file whose size and
sha256 match the pin is moved into the cache, so an interrupted or corrupted
download never becomes a cache entry.

    python -m tpfix.stages.fetch [--line TAG]    # sdist + official wheel for this arch
    python -m tpfix.stages.fetch --all           # every artifact of every pin file
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tpfix.core.lines import LINES, PINS, Artifact, get_line, load_pins, sdist_pin, wheel_pin
from tpfix.core.util import Fail, cache_dir, cache_lock, host_arch, main_wrapper, run, sha256_file

if TYPE_CHECKING:
    from tpfix.core.context import BuildContext


def cached_path(art: Artifact) -> Path:
    return cache_dir() / "sha256" / art.sha256 / art.filename


def check_file(path: Path, art: Artifact) -> None:
    """Raise Fail unless `path` is exactly the pinned artifact."""
    size = path.stat().st_size
    actual = sha256_file(path)
    if size != art.size:
        raise Fail(
            f"{art.filename}: {size} bytes, the pin says {art.size} (truncated or "
            f"interrupted download): expected sha256 {art.sha256}, got {actual}; "
            "run the build again to refetch"
        )
    if actual != art.sha256:
        raise Fail(f"{art.filename}: sha256 mismatch: expected {art.sha256}, got {actual}")


def _pip_args(art: Artifact) -> list[str]:
    if art.is_sdist:
        # pip prepares the sdist's metadata after checking its hash; vLLM's
        # setup.py needs the build dependencies of this venv for that.
        return ["--no-binary", art.project, "--no-build-isolation"]
    args = ["--only-binary", ":all:"]
    if art.platform:
        args += ["--platform", art.platform, "--python-version", "3.12"]
    return args


def _explain_pip_failure(art: Artifact, output: str) -> str:
    got = re.search(r"Got\s+([0-9a-f]{64})", output)
    if "DO NOT MATCH THE HASHES" in output and got:
        return (
            f"{art.filename}: sha256 mismatch: expected {art.sha256}, "
            f"got {got.group(1)}; the index serves a different file than the "
            "pin. Check the release before changing the pin."
        )
    if "No matching distribution" in output or "Could not find a version" in output:
        return (
            f"{art.filename}: {art.project}=={art.version} is not available from "
            "the package index pip is configured with (check pip.conf / network)"
        )
    tail = "\n  ".join(output.strip().splitlines()[-8:])
    return f"{art.filename}: pip download failed:\n  {tail}"


def _pip_download(art: Artifact, requirement: list[str], out: Path):
    """`pip download --no-deps` of `requirement` (pip's arguments) into `out`,
    with `art`'s arguments (_pip_args) and environment: the one pip call."""
    # pip prepares an sdist's metadata in its unpacked tree: no PYTHONPATH of
    # ours (a relative `tests` entry there would be vLLM's own tests/)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if art.project == "vllm" and art.is_sdist:
        env.update(VLLM_TARGET_DEVICE="empty", VLLM_VERSION_OVERRIDE=art.version)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    return run([*cmd, *requirement, "-d", str(out), *_pip_args(art)], env=env)


def _tmp_dir() -> tempfile.TemporaryDirectory:
    """A private folder in the cache's file system (os.replace into it is atomic)."""
    tmp_root = cache_dir() / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=tmp_root)


def fetch(art: Artifact, pinfile: Path | None = None) -> Path:
    """Return the verified cached file of `art`, downloading it if needed."""
    with cache_lock(f"fetch-{art.sha256}"):
        return _fetch(art, pinfile)


def _fetch(art: Artifact, pinfile: Path | None) -> Path:
    dest = cached_path(art)
    if dest.exists():
        try:
            check_file(dest, art)
            return dest
        except Fail as e:
            print(f"warning: cache entry rejected, refetching: {e}", file=sys.stderr)
            dest.unlink()
    with _tmp_dir() as tmp:
        req = Path(tmp) / "requirement.txt"
        req.write_text(f"{art.project}=={art.version} --hash=sha256:{art.sha256}\n")
        out = Path(tmp) / "out"
        print(f"fetch: {art.filename} (pip download)", file=sys.stderr)
        proc = _pip_download(art, ["--require-hashes", "-r", str(req)], out)
        if proc.returncode != 0 and "No space left on device" in proc.stdout + proc.stderr:
            # A full disk, not a download error: the pipeline names the file system.
            raise OSError(errno.ENOSPC, "No space left on device", tmp)
        if proc.returncode != 0:
            raise Fail(_explain_pip_failure(art, proc.stdout + proc.stderr))
        got = out / art.filename
        if not got.exists():
            names = sorted(p.name for p in out.iterdir()) if out.exists() else []
            raise Fail(
                f"{art.filename}: pip downloaded {names or 'nothing'} instead; "
                f"check the filename in {pinfile or 'the pin file'}"
            )
        check_file(got, art)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, dest)  # same file system: atomic
    return dest


ARCH_PLATFORMS = {"x86_64": "manylinux_2_28_x86_64", "aarch64": "manylinux_2_28_aarch64"}


def pin_release(project: str, version: str) -> list[Artifact]:
    """Download the sdist and the official wheels of a release that has no pins
    yet, with pip (`fetch`'s arguments, without hashes), and return their pins:
    sha256, size and platform of the downloaded files, which go into the cache
    under those hashes.  A proposal for a person to review before commit.
    """
    wanted = [Artifact(project, version, "sdist", "x.tar.gz", 0, "")] + [
        Artifact(project, version, "wheel", "x.whl", 0, "", arch, plat)
        for arch, plat in ARCH_PLATFORMS.items()
    ]
    return [_download_unpinned(want) for want in wanted]


def pin_test_dep(project: str, version: str) -> Artifact:
    """The pin of a pure-Python wheel the tests import (e.g. the FlashInfer a new
    tag pins), from the downloaded file, as pin_release does."""
    return _download_unpinned(Artifact(project, version, "test", "x.whl", 0, ""))


def _download_unpinned(want: Artifact) -> Artifact:
    with _tmp_dir() as tmp:
        what = f"{want.project}=={want.version} {want.arch or ''} {want.role}"
        print(f"pin: {what} (pip download)", file=sys.stderr)
        proc = _pip_download(want, [f"{want.project}=={want.version}"], Path(tmp))
        files = [f for f in Path(tmp).iterdir() if f.is_file()]
        if proc.returncode != 0 or len(files) != 1:
            tail = " ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
            raise Fail(f"{what}: pip download failed: {tail}")
        got = files[0]
        # the platform as the file names it (pip may pick a newer manylinux)
        plat = got.name.removesuffix(".whl").split("-")[-1] if want.platform else None
        art = Artifact(
            want.project,
            want.version,
            want.role,
            got.name,
            got.stat().st_size,
            sha256_file(got),
            want.arch,
            plat,
        )
        dest = cached_path(art)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, dest)
    return art


def fetch_inputs(ctx: BuildContext, arch: str) -> tuple[Path, Path]:
    """The build's inputs, by the context's pins: (the sdist, the official `arch` wheel)."""
    pins = ctx.line.pins
    return fetch(ctx.sdist_pin, pins), fetch(ctx.wheel_pin(arch), pins)


def fetch_sdist(tag: str) -> Path:
    return fetch(sdist_pin(tag))


def fetch_wheel(arch: str, tag: str) -> Path:
    return fetch(wheel_pin(arch, tag))


def all_pin_files() -> list[Path]:
    """pins/*.toml (shared) and every line's patches/<tag>/pins.toml."""
    return sorted(PINS.glob("*.toml")) + sorted(LINES.glob("*/pins.toml"))


def pinned_test_dep(project: str, version: str) -> tuple[Artifact, Path] | None:
    """The pin of a test input (role "test") and its pin file: pins/flashinfer.toml
    or a line's pins; None where there is none."""
    for pinfile in [PINS / "flashinfer.toml", *sorted(LINES.glob("*/pins.toml"))]:
        for art in load_pins(pinfile):
            if art.role == "test" and art.project == project and art.version == version:
                return art, pinfile
    return None


def fetch_test_dep(project: str, version: str) -> Path:
    """A test input (role "test") of pins/flashinfer.toml or of a line's pins."""
    if found := pinned_test_dep(project, version):
        return fetch(*found)
    raise Fail(f"{PINS / 'flashinfer.toml'}: no pin for {project}=={version}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every artifact of every pin")
    ap.add_argument("--arch", default=host_arch())
    ap.add_argument("--line", help="release line (default: the top-level VERSION's)")
    args = ap.parse_args()
    tag = get_line(args.line).tag
    if args.all:
        todo = [(a, p) for p in all_pin_files() for a in load_pins(p)]
    else:
        todo = [(sdist_pin(tag), None), (wheel_pin(args.arch, tag), None)]
    for art, pinfile in todo:
        print(fetch(art, pinfile))


if __name__ == "__main__":
    main_wrapper(main)
