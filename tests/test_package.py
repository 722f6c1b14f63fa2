# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The package stage (tpfix.stages.package): what dist/ holds beside the wheel (SBOM,
provenance, index, SHA256SUMS), reproducible, republished whole, and a publish
killed at any step repaired by the next.  On a small dist/ (small_dist.py;
the SBOM's content: test_sbom.py, provenance and signing: test_attest.py) and,
slow, on the dist/ of a real ./build.sh.

Fast tier: a missing tool stopping the build.  Slow tier: every package
stage, and the real build's dist/.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from small_dist import SIDE, check_sums, keypair, publish_small, sha, statement, sums
from wheels import make_wheel

from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line, sdist_pin, wheel_pin
from tpfix.core.util import Fail
from tpfix.stages import package


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_dist_holds_the_wheel_sbom_provenance_and_index_all_in_sha256sums(tmp_path: Path):
    dist, wheel, sdist, official = publish_small(tmp_path)
    files = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file())
    expected = sorted(
        [wheel.name, *(wheel.name + s for s in SIDE), "SHA256SUMS"]
        + ["simple/index.html", "simple/vllm/index.html"]
    )
    assert files == expected
    assert sorted(sums(dist)) == sorted(set(expected) - {"SHA256SUMS"})
    check_sums(dist)
    assert not [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]  # all moved


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_package_stage_is_byte_reproducible(tmp_path: Path):
    a, wa, _, _ = publish_small(tmp_path / "a")
    b, wb, _, _ = publish_small(tmp_path / "b")
    assert (a / "SHA256SUMS").read_bytes() == (b / "SHA256SUMS").read_bytes()


@pytest.mark.slow  # package stages (about a second each)
def test_both_arches_share_one_dist_and_one_index(tmp_path: Path):
    """./build.sh and ./build.sh --arch aarch64 into one dist: the second
    keeps the first's wheel and files (same version), SHA256SUMS and simple/
    list both; a newer revision of one arch removes the older version's of
    both.  The package stage's real code on tiny wheels named per arch."""
    version, newer = "0.27.1+tpfix.3", "0.27.1+tpfix.4"
    dist, x86, _, _ = publish_small(tmp_path / "x86", version, arch="x86_64")
    _, arm, _, _ = publish_small(tmp_path / "x86", version, arch="aarch64")
    assert x86.parent == arm.parent == dist
    both = [x86.name, arm.name]
    files = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file())
    expected = [*both, *(w + s for w in both for s in SIDE), "SHA256SUMS"]
    expected += ["simple/index.html", "simple/vllm/index.html"]
    assert files == sorted(expected)
    assert sorted(sums(dist)) == sorted(set(expected) - {"SHA256SUMS"})
    check_sums(dist)
    page = (dist / "simple" / "vllm" / "index.html").read_text()
    assert all(f"../../{w}#sha256={sha(dist / w)}" in page for w in both), page
    # each arch's wheel is found by its arch; with both there, "the" wheel is ambiguous
    assert package.find_wheel(dist, "aarch64") == (arm, sha(arm))
    assert package.find_wheel(dist, "x86_64") == (x86, sha(x86))
    with pytest.raises(Fail, match=r"lists 2 vllm wheels \(vllm-\*\.whl\), expected exactly one"):
        package.find_wheel(dist)
    # rebuilding one arch at the same version keeps the other
    publish_small(tmp_path / "x86", version, arch="x86_64")
    assert sorted(sums(dist)) == sorted(set(expected) - {"SHA256SUMS"})
    # a newer revision: the older version's files of both arches go
    _, x86_new, _, _ = publish_small(tmp_path / "x86", newer, arch="x86_64")
    files = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file())
    assert files == sorted(
        [x86_new.name, *(x86_new.name + s for s in SIDE), "SHA256SUMS"]
        + ["simple/index.html", "simple/vllm/index.html"]
    )
    with pytest.raises(Fail, match=r"lists 0 vllm wheels \(vllm-\*\.whl\) for aarch64"):
        package.find_wheel(dist, "aarch64")
    check_sums(dist)


IMAGE_FILES = (".tar", ".cdx.json", ".provenance.json")  # tpfix.image.image's, per arch


def _add_image(dist: Path, arch: str | None, name: str = "vllm-openai-v0.27.1-tpfix.3") -> set:
    """What tpfix.image.image adds for one arch's image (`arch`), or for the
    manifest list over both (None), with its replacement rule."""
    if arch is None:
        texts = {
            Path("image", f"{name}.oci.tar"): "list",
            Path("image", f"{name}.provenance.json"): "{}",
        }
        package.add_to_dist(dist, texts)
    else:
        texts = {Path("image", f"{name}-{arch}{s}"): arch for s in IMAGE_FILES}
        package.add_to_dist(dist, texts, replacing=package.replaced_by_image(arch))
    return {p.as_posix() for p in texts}


@pytest.mark.slow  # package stages (about a second each)
def test_each_arch_keeps_the_other_arch_image_files_in_one_dist(tmp_path: Path):
    """./build.sh --arch all --image into one dist, then one arch again: the
    image files are per arch (package.image_arch); an image of one arch, or
    its wheel built again with other bytes, replaces that arch's and the
    manifest list's, listed and on disk, the other arch's stay (advisory
    reports of its SBOM included); the same wheel bytes with the same
    signer (a cached rebuild) keep them all, a new signer does not; a newer
    revision drops all.
    The package stage's real code on tiny wheels, image files written as
    tpfix.image.image names them (their content does not matter here)."""
    version = "0.27.1+tpfix.3"
    publish_small(tmp_path, version, arch="x86_64")
    dist = publish_small(tmp_path, version, arch="aarch64")[0]
    x86, arm, lst = _add_image(dist, "x86_64"), _add_image(dist, "aarch64"), _add_image(dist, None)

    def images() -> set:
        on_disk = {p.relative_to(dist).as_posix() for p in (dist / "image").glob("*")}
        assert {p for p in sums(dist) if p.startswith("image/")} == on_disk
        return on_disk

    assert images() == x86 | arm | lst
    check_sums(dist)
    assert {package.image_arch(Path(p)) for p in x86} == {"x86_64"}
    assert {package.image_arch(Path(p)) for p in lst} == {None}
    # the x86_64 image again: its own files are replaced, the list's go (from
    # the list and from the folder: an old list must not verify), arm's stay
    _add_image(dist, "x86_64")
    assert images() == x86 | arm
    _add_image(dist, None)
    # the aarch64 wheel again, same bytes (a cached rebuild): its image still
    # is that wheel's, so all image files stay
    shutil.rmtree(tmp_path / "staging")  # a fresh one, as each build has (pipeline.staged)
    publish_small(tmp_path, version, arch="aarch64")
    assert images() == x86 | arm | lst
    # the reports tpfix.audit.advisories writes for x86_64's image SBOM are x86_64's
    # too: an aarch64 image again leaves them (and x86_64's image) alone
    name = "vllm-openai-v0.27.1-tpfix.3-x86_64"
    reports = {Path("image", f"{name}{s}"): "{}" for s in (".advisories.json", ".vex.cdx.json")}
    package.add_to_dist(dist, reports)
    x86 |= {p.as_posix() for p in reports}
    assert {package.image_arch(p) for p in reports} == {"x86_64"}
    _add_image(dist, "aarch64")
    assert images() == x86 | arm
    _add_image(dist, None)
    # other bytes under the same name: its image and the list go, x86_64's stay
    shutil.rmtree(tmp_path / "staging")
    publish_small(tmp_path, version, arch="aarch64", requires=("other-dep==1",))
    assert images() == x86
    check_sums(dist)
    # the same bytes again, but now signed: the kept image files' envelopes
    # would not be this folder's signer's, so aarch64's and the list's go;
    # x86_64's stay, their statement signed by the folder's new key
    _add_image(dist, "aarch64"), _add_image(dist, None)
    (tmp_path / "key").mkdir()
    priv, _ = keypair(tmp_path / "key")
    shutil.rmtree(tmp_path / "staging")
    publish_small(tmp_path, version, priv, arch="aarch64", requires=("other-dep==1",))
    assert images() == x86 | {"image/vllm-openai-v0.27.1-tpfix.3-x86_64.intoto.jsonl"}
    check_sums(dist)
    # a newer revision of one arch: every image file of the older goes
    shutil.rmtree(tmp_path / "staging")
    publish_small(tmp_path, "0.27.1+tpfix.4", priv, arch="x86_64")
    assert images() == set()
    check_sums(dist)


def test_a_missing_tool_is_named_before_any_download(monkeypatch):
    from tpfix import pipeline

    monkeypatch.setitem(pipeline.TOOLS, "tpfix_no_such_module", ("simple503", "the index"))
    with pytest.raises(Fail, match=r"missing in .*: simple503 \(the index\); ./build.sh"):
        pipeline.check_tools()


@pytest.mark.slow  # a package stage (about a second): not while editing a patch
def test_republishing_replaces_every_file_of_the_old_wheel(tmp_path: Path):
    dist, old, _, _ = publish_small(tmp_path / "one", "0.27.1+tpfix.2")
    # an advisory report of the old one, as tpfix.audit.advisories adds it
    package.add_to_dist(dist, {Path(f"{old.name}.vex.cdx.json"): "{}"})
    shutil.rmtree(tmp_path / "one" / "staging")
    staging = tmp_path / "one" / "staging"
    wheel = make_wheel(staging, "0.27.1+tpfix.3")
    sd = tmp_path / "one" / "vllm-0.27.1.tar.gz"
    off = tmp_path / "one" / "vllm-0.27.1-py3-none-any.whl"
    extras = package.describe(wheel, BuildContext.resolve(get_line()), sd, off, "x86_64", "1", None)
    new = package.publish(wheel, dist, extras)
    assert not [p for p in dist.iterdir() if p.name.startswith(old.name)]
    assert sorted(p.name for p in dist.glob("vllm-*")) == sorted(
        [new.name, *(new.name + s for s in SIDE)]
    )
    assert "0.27.1+tpfix.2" not in (dist / "simple" / "vllm" / "index.html").read_text()
    check_sums(dist)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_a_publish_killed_at_any_step_leaves_whole_files_and_the_next_repairs(
    tmp_path: Path, monkeypatch
):
    """Kill publish (KeyboardInterrupt, as SIGTERM becomes) at its n-th move or
    at SHA256SUMS: every file is the old or the new one in full, and a new
    publish leaves a dist/ that `sha256sum -c` accepts, with nothing stale."""
    dist, old, sd, off = publish_small(tmp_path / "first", "0.27.1+tpfix.2")
    (dist / "image").mkdir()
    (dist / "image" / "old.cdx.json").write_text("{}")  # an image of the old wheel
    package.write_sums(dist, [*package.listed(dist), Path("image/old.cdx.json")])
    whole = {p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    old_sums = (dist / "SHA256SUMS").read_bytes()
    real_replace = os.replace
    for n in range(1, 12):
        staging = tmp_path / f"staging{n}"
        wheel = make_wheel(staging, "0.27.1+tpfix.3")
        extras = package.describe(
            wheel, BuildContext.resolve(get_line()), sd, off, "x86_64", "1", None
        )
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
            check_sums(dist)
        if finished:
            break
    else:
        pytest.fail("publish never got past 11 moves")
    assert n > 3  # it was killed at each earlier step
    # the next build (here: the same files staged again) repairs whatever was left
    staging = tmp_path / "again"
    wheel = make_wheel(staging, "0.27.1+tpfix.3")
    package.publish(
        wheel,
        dist,
        package.describe(wheel, BuildContext.resolve(get_line()), sd, off, "x86_64", "1", None),
    )
    check_sums(dist)
    assert not (dist / "image" / "old.cdx.json").exists()  # listed before, not now: removed
    assert not [p for p in dist.glob("vllm-0.27.1+tpfix.2*")]


@pytest.mark.slow
def test_built_dist_holds_valid_sbom_provenance_and_index(built_wheel: Path):
    dist = built_wheel.parent
    arch = built_wheel.name.rsplit("_", 2)[-2] if "aarch64" in built_wheel.name else "x86_64"
    listed = set(sums(dist))
    assert listed == {
        built_wheel.name,
        *(built_wheel.name + s for s in SIDE),
        "simple/index.html",
        "simple/vllm/index.html",
    }
    check_sums(dist)
    from sbom_checks import check_wheel_sbom

    check_wheel_sbom(
        dist / f"{built_wheel.name}.cdx.json",
        built_wheel,
        sdist_pin(get_line().tag).sha256,
        wheel_pin(arch, get_line().tag).sha256,
    )
    stmt = statement(dist / f"{built_wheel.name}.provenance.json")
    assert stmt["subject"][0]["digest"]["sha256"] == sha(built_wheel)
    # ./build.sh --dist D --workdir W: the output folders are not recorded
    assert stmt["predicate"]["buildDefinition"]["externalParameters"]["command"] == "./build.sh"
