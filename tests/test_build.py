# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The build as a user runs it: ./build.sh, then what the wheel must be.

One real build (and a second one for reproducibility, both --no-cache) per
session, and a rebuild from the built-wheel cache; the other checks read the
wheels they produced.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, run_build_sh

from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line, read_pin_file, read_version, wheel_pin
from tpfix.core.patch_format import read_series
from tpfix.replay.harness import tree_after
from tpfix.stages.fetch import fetch_wheel
from tpfix.stages.patch import cached_tree
from tpfix.stages.verify import touched_files, verify_wheel

# builds two wheels with ./build.sh
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built(built_wheel: Path) -> Path:
    return built_wheel


@pytest.fixture(scope="session")
def official() -> Path:
    return fetch_wheel(_arch(), get_line().tag)


def _arch() -> str:
    from tpfix.core.util import host_arch

    return host_arch()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_wheel_carries_version_from_VERSION_everywhere(built: Path):
    version = get_line().version
    assert built.name == (
        f"vllm-{version}-cp38-abi3-{wheel_pin(_arch(), get_line().tag).platform}.whl"
    )
    with zipfile.ZipFile(built) as z:
        meta = z.read(f"vllm-{version}.dist-info/METADATA").decode()
        assert f"\nVersion: {version}\n" in meta
        scope: dict = {}
        exec(z.read("vllm/_version.py").decode(), scope)
    assert scope["__version__"] == version


def test_sha256sums_lists_the_wheel(built: Path):
    sums = (built.parent / "SHA256SUMS").read_text()
    assert f"{_sha(built)}  {built.name}\n" in sums
    # beside the wheel only what describes it (tests/test_package.py checks each)
    assert sorted(p.name for p in built.parent.iterdir()) == sorted(
        ["SHA256SUMS", "simple", built.name]
        + [built.name + s for s in (".cdx.json", ".metadata", ".provenance.json")]
    )


def _walk(built: Path, official: Path, touched: set[str], tree: Path, min_binaries: int) -> str:
    """Independent of scripts/tpfix/stages/verify.py: walk both wheels here; the
    built wheel's METADATA comes back."""
    with zipfile.ZipFile(built) as b, zipfile.ZipFile(official) as o:
        bnames = {n for n in b.namelist() if ".dist-info/" not in n}
        onames = {n for n in o.namelist() if ".dist-info/" not in n}
        assert bnames - onames <= touched
        assert onames <= bnames
        binaries = [n for n in onames if n.endswith(".so")]
        assert len(binaries) >= min_binaries
        for n in binaries:
            assert b.read(n) == o.read(n), n
        differing = {n for n in onames if b.read(n) != o.read(n)}
        assert differing <= touched | {"vllm/_version.py"}
        for n in bnames & touched:
            assert b.read(n) == (tree / n).read_bytes(), n
        meta = next(n for n in b.namelist() if n.endswith(".dist-info/METADATA"))
        return b.read(meta).decode()


def test_binaries_identical_and_only_series_files_differ(built: Path, official: Path):
    tree = tree_after(read_series(get_line().series)[-1])
    meta = _walk(built, official, touched_files(get_line()), tree, 17)
    assert "Requires-Dist: flashinfer-python==0.6.16.post4" in meta
    assert verify_wheel(built, official, tree, BuildContext.resolve(get_line())) == []


def test_verify_rejects_changed_binary_and_unexpected_file(
    built: Path, official: Path, tmp_path: Path
):
    tampered = tmp_path / built.name
    shutil.copyfile(built, tampered)
    with zipfile.ZipFile(official) as o:
        so = sorted(n for n in o.namelist() if n.endswith(".so"))[0]
        data = bytearray(o.read(so))
    data[-1] ^= 0xFF
    # Appending a second entry of the same name makes it the one readers see.
    with zipfile.ZipFile(tampered, "a") as z:
        z.writestr(so, bytes(data))
        z.writestr("vllm/unexpected.py", "x = 1\n")
        z.writestr("vllm/__init__.py", "# changed outside the series\n")
    tree = tree_after(read_series(get_line().series)[-1])
    problems = verify_wheel(tampered, official, tree, BuildContext.resolve(get_line()))
    assert f"{so}: compiled binary differs from the official wheel" in problems
    assert "vllm/unexpected.py: in the built wheel only" in problems
    assert "vllm/__init__.py: file differs from the official wheel" in problems


def test_two_builds_are_byte_identical(built: Path, tmp_path: Path):
    again = run_build_sh(tmp_path / "dist", tmp_path / "work", None, "--no-cache")
    assert again.name == built.name
    assert _sha(again) == _sha(built)
    # and so is everything beside it: SBOM, provenance, index (SHA256SUMS lists them)
    assert (again.parent / "SHA256SUMS").read_bytes() == (built.parent / "SHA256SUMS").read_bytes()


def test_a_rebuild_with_nothing_changed_publishes_the_cached_wheel(built: Path, tmp_path: Path):
    """The built fixture stored its wheel (wheel_cache): a rebuild of the same
    inputs publishes it without patching or building, and the same files."""
    dist = tmp_path / "dist"
    cmd = [str(ROOT / "build.sh"), "--dist", str(dist), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"==> build: {built.name} as built and verified before" in proc.stderr
    assert "==> patch" not in proc.stderr and "==> verify" not in proc.stderr
    assert (dist / "SHA256SUMS").read_bytes() == (built.parent / "SHA256SUMS").read_bytes()
    assert _sha(dist / built.name) == _sha(built)


# -- the other release lines (patches/TAG/), built with ./build.sh --line TAG -----------


def test_other_line_wheel_is_the_official_one_plus_its_series(line_build):
    line, built = line_build
    version = read_version(line.version_file)
    names = read_series(line.series)
    official = fetch_wheel(_arch(), line.tag)
    assert built.name == official.name.replace(official.name.split("-")[1], version)
    touched = touched_files(line, names)
    tree = cached_tree(line)
    ours = _walk(built, official, touched, tree, 10)  # v0.33.0: 13 (Rust frontend, kernels)
    public = version.split("+")[0]
    with zipfile.ZipFile(official) as o:
        theirs = o.read(f"vllm-{public}.dist-info/METADATA").decode()
    # the metadata differs in the version only, and in the FlashInfer the
    # series re-pins, if it does (pins.toml `flashinfer-repinned`)
    theirs = theirs.replace(f"\nVersion: {public}\n", f"\nVersion: {version}\n", 1)
    facts = read_pin_file(line.pins)
    if repinned := facts.get("flashinfer-repinned"):
        pin = "\nRequires-Dist: flashinfer-python=={}\n"
        assert pin.format(facts["flashinfer"]) in theirs
        theirs = theirs.replace(pin.format(facts["flashinfer"]), pin.format(repinned), 1)
    assert ours == theirs
    assert verify_wheel(built, official, tree, BuildContext.resolve(line)) == []
    assert f"{_sha(built)}  {built.name}\n" in (built.parent / "SHA256SUMS").read_text()


def test_other_line_builds_are_byte_identical(line_build, tmp_path: Path):
    line, built = line_build
    again = run_build_sh(tmp_path / "dist", tmp_path / "work", line.tag, "--no-cache")
    assert _sha(again) == _sha(built)
    assert (again.parent / "SHA256SUMS").read_bytes() == (built.parent / "SHA256SUMS").read_bytes()
