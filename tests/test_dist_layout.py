# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""dist/ holds published files only: the build's locks and the image's build
context live under build/ (lines.dist_state), for every line's folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from wheels import make_wheel

from tpfix import pipeline
from tpfix.core.context import BuildContext, Release
from tpfix.core.lines import dist_state, get_line, line_names, read_version
from tpfix.core.util import ROOT
from tpfix.image import image
from tpfix.stages import package


def test_the_pipelines_steps_leave_only_published_files_in_dist(tmp_path: Path):
    line = get_line(line_names()[-1])  # a line whose folder is dist/<tag>/ by default
    top = tmp_path / "dist"
    dist = top / line.tag
    version, epoch = read_version(line.version_file), 1700000000
    official = make_wheel(tmp_path / "official", version.split("+")[0])
    sdist = tmp_path / f"vllm-{version.split('+')[0]}.tar.gz"
    sdist.write_bytes(b"stand-in for the pinned sdist")
    # the steps of ./build.sh --line TAG --image that write: locks held from
    # start to end, the package stage, the image's build context
    state = dist_state(dist)
    try:
        with pipeline.build_locks(tmp_path / "work", dist):
            wheel = make_wheel(tmp_path / "staging", version)
            ctx = BuildContext.resolve(line)
            extras = package.describe(wheel, ctx, sdist, official, "x86_64", epoch)
            final = package.publish(wheel, dist, extras)
            release = Release(ctx, final, sdist, official, "x86_64", epoch)
            image.stage_context(release, image.context_dir(dist))
        published = {Path("SHA256SUMS"), *package.listed(dist)}
        assert {p.relative_to(dist) for p in dist.rglob("*") if p.is_file()} == published
        assert list(top.iterdir()) == [dist]  # no lock, no image context beside it
        assert state.is_relative_to(ROOT / "build") and (state / "lock").exists()
        assert image.context_dir(dist).is_relative_to(state)
        assert (image.context_dir(dist) / "dist" / final.name).exists()
    finally:
        shutil.rmtree(state, ignore_errors=True)
