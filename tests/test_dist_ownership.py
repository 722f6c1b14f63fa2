# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What a build may remove from, keep in and sign in a dist folder it shares
(tpfix.stages.package.publish): only what a SHA256SUMS of this project
listed (or a killed publish was moving in) is removed, anything else is
kept and named in one warning line; a cached rebuild keeps its arch's audit
reports; a new signing key signs the other arch's statements again.  The
package stage's real code on tiny wheels (small_dist.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from small_dist import check_sums, keypair, publish_small, sums

from tpfix.release import attest
from tpfix.stages import dist_folder, package

VERSION = "0.27.1+tpfix.3"
WHY = "(a server publishing the folder serves them and verify.py --dist refuses it: move them out)"


def _fresh(tmp: Path) -> Path:
    """A fresh staging folder for the next publish_small, as each build has one."""
    shutil.rmtree(tmp / "staging", ignore_errors=True)
    return tmp


@pytest.mark.slow  # package stages (about a second each)
def test_a_build_keeps_and_names_what_it_did_not_write(tmp_path: Path, capsys):
    """The release engineer's folder: notes and a config named vllm-*, an
    older vllm wheel no build of ours listed, another project's index page
    in simple/; two builds into it remove none of them, and each names all
    of them in one warning line."""
    dist = tmp_path / "dist"
    foreign = {
        "notes.txt": "mine",
        "vllm-notes.txt": "mine too",
        "vllm-config.yaml": "model: x\n",
        "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl": "someone's wheel",
        "simple/flashinfer-python/index.html": "<a href='x.whl'>x</a>",
    }
    for rel, text in foreign.items():
        (dist / rel).parent.mkdir(parents=True, exist_ok=True)
        (dist / rel).write_text(text)
    for version in (VERSION, "0.27.1+tpfix.4"):
        publish_small(_fresh(tmp_path), version)
        assert {rel: (dist / rel).read_text() for rel in foreign} == foreign
        err = capsys.readouterr().err
        warning = [ln for ln in err.splitlines() if ln.startswith("warning:")]
        assert len(warning) == 1, err
        assert f"warning: kept in {dist} what no build of this project wrote: " in warning[0]
        named = [*list(foreign)[:-1], "simple/flashinfer-python/"]
        assert warning[0].endswith(": " + ", ".join(sorted(named)) + " " + WHY), warning[0]
        check_sums(dist)
        assert not set(foreign) & set(sums(dist))
    assert not list(dist.glob("vllm-0.27.1+tpfix.3*"))  # ours, listed before: gone


@pytest.mark.slow  # package stages (about a second each)
def test_a_publish_killed_after_its_first_move_leaves_nothing_of_it_after_the_next(
    tmp_path: Path, monkeypatch
):
    """Killed (SIGTERM as KeyboardInterrupt) right after the new wheel moved
    in, before any SHA256SUMS lists it: dist/.publishing names it as ours, so
    the next build, of another version, removes it; a foreign file stays."""
    dist, old, _, _ = publish_small(tmp_path, VERSION)
    (dist / "notes.txt").write_text("mine")
    real_replace, moves = os.replace, []

    def dying_replace(src, dst):
        real_replace(src, dst)
        moves.append(dst)
        if Path(dst).name.endswith(".whl"):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        publish_small(_fresh(tmp_path), "0.27.1+tpfix.4")
    monkeypatch.setattr(os, "replace", real_replace)
    orphan = dist / "vllm-0.27.1+tpfix.4-py3-none-any.whl"
    assert orphan.exists() and orphan.name not in sums(dist)
    assert (dist / dist_folder.PUBLISHING).exists()
    publish_small(_fresh(tmp_path), "0.27.1+tpfix.5")
    assert not orphan.exists() and not (dist / dist_folder.PUBLISHING).exists()
    assert (dist / "notes.txt").read_text() == "mine"
    check_sums(dist)


@pytest.mark.slow  # package stages (about a second each)
def test_a_cached_rebuild_keeps_its_arch_audit_reports(tmp_path: Path, capsys):
    """./build.sh of both arches, the resolved SBOM and advisories of x86_64,
    then x86_64 again: with the same wheel and SBOM bytes (a cached rebuild)
    its reports stay, listed; with other bytes they go, with one line naming
    them and the commands that remake them.  aarch64's are never touched."""
    publish_small(tmp_path, VERSION, arch="x86_64")
    dist, arm, _, _ = publish_small(_fresh(tmp_path), VERSION, arch="aarch64")
    x86 = next(dist.glob("*x86_64.whl"))
    reports = {Path(x86.name + s): "{}" for s in dist_folder.AUDITS}
    reports[Path(arm.name + ".resolved.cdx.json")] = "{}"
    package.add_to_dist(dist, reports)
    capsys.readouterr()
    publish_small(_fresh(tmp_path), VERSION, arch="x86_64")
    assert {p.as_posix() for p in reports} <= set(sums(dist))
    assert all((dist / p).exists() for p in reports)
    assert "note:" not in capsys.readouterr().err
    check_sums(dist)
    publish_small(_fresh(tmp_path), VERSION, arch="x86_64", requires=("other-dep==1",))
    mine = sorted(x86.name + s for s in dist_folder.AUDITS)
    assert not set(mine) & set(sums(dist)) and not any((dist / p).exists() for p in mine)
    assert arm.name + ".resolved.cdx.json" in sums(dist)
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"note: dropped {', '.join(mine)} from {dist}: "), notes
    assert "python -m tpfix.audit.resolved_sbom" in notes[0] and "--arch x86_64" in notes[0]
    assert "python -m tpfix.audit.advisories" in notes[0]
    check_sums(dist)


@pytest.mark.slow  # package stages (about a second each)
def test_a_new_key_signs_every_arch_again(tmp_path: Path):
    """Both arches signed with one key, then aarch64 rebuilt with another:
    every statement's envelope in the folder verifies with the new key (the
    x86_64 wheel's and its image's included), and the folder as a whole."""
    from tpfix.release import dist_verify

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    old_key, _ = keypair(tmp_path / "a")
    new_key, new_pub = keypair(tmp_path / "b")
    old = attest.load_signer(old_key)
    publish_small(tmp_path, VERSION, old_key, arch="x86_64")
    dist, _, _, _ = publish_small(_fresh(tmp_path), VERSION, old_key, arch="aarch64")
    image = Path("image", "vllm-openai-v0.27.1-tpfix.3-x86_64.provenance.json")
    statement = next(dist.glob("*x86_64.whl.provenance.json")).read_text()  # a stand-in
    package.add_image_files(dist, {image: statement}, image, None, signer=old)
    publish_small(_fresh(tmp_path), VERSION, new_key, arch="aarch64")
    envelopes = sorted(p for p in dist.rglob("*.intoto.jsonl"))
    assert len(envelopes) == 4, envelopes  # both wheels', x86_64's image's, the folder's
    for env in envelopes:
        if env.name != attest.SUMS_ENVELOPE:
            attest.verify(env, new_pub)  # raises where the old key signed it
    assert len(dist_verify.verify_dist(str(dist), str(new_pub))) == len(sums(dist))
    check_sums(dist)
