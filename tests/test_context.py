# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""One build's inputs resolved once (scripts/tpfix/core/context.py), for every
committed line: BuildContext says what the line's own files say (VERSION,
series, pins.toml, the fingerprint), reads each of them once, takes the
arches from the pins, and refuses an arch or a file it does not have with
the file's name.  That the build hands this one object to every stage is
test_pipeline.py's (main) and the stages' own tests'."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tpfix.core.context import BuildContext, Release
from tpfix.core.lines import Line, fingerprint, get_line, line_names, load_pins, read_version
from tpfix.core.patch_format import read_series
from tpfix.core.util import Fail


@pytest.mark.parametrize("tag", line_names())
def test_the_context_is_what_the_line_files_say(tag):
    line = get_line(tag)
    ctx = BuildContext.resolve(line)
    assert ctx.line == line and ctx.tag == tag
    assert ctx.version == read_version(line.version_file)
    assert list(ctx.series) == read_series(line.series) and ctx.series
    assert list(ctx.pins) == load_pins(line.pins)
    assert ctx.cuda == line.official_cuda()
    assert ctx.fingerprint == fingerprint(line)
    arches = sorted(a.arch for a in load_pins(line.pins) if a.role == "wheel")
    assert ctx.arches == arches and len(arches) == 2  # x86_64 and aarch64, as pinned
    assert ctx.sdist_pin.role == "sdist" and ctx.sdist_pin.version == tag[1:]
    for arch in arches:
        assert ctx.wheel_pin(arch).arch == arch and ctx.wheel_pin(arch).role == "wheel"


def test_each_file_is_read_once(monkeypatch):
    """VERSION, series and pins.toml once each, and each patch once (for the fingerprint)."""
    line = get_line()
    reads: list[Path] = []
    for name in ("read_text", "read_bytes"):
        real = getattr(Path, name)

        def counted(self, *a, _real=real, **kw):
            reads.append(self)
            return _real(self, *a, **kw)

        monkeypatch.setattr(Path, name, counted)
    ctx = BuildContext.resolve(line)
    monkeypatch.undo()
    mine = [p for p in reads if p.parent == line.patches]
    want = [line.version_file, line.series, line.pins, *(line.patches / n for n in ctx.series)]
    assert sorted(mine) == sorted(want)  # each once, nothing else of the line's folder


def test_an_arch_or_a_pin_the_line_lacks_is_named(tmp_path):
    ctx = BuildContext.resolve(get_line())
    with pytest.raises(Fail, match=r"pins\.toml: no official wheel pinned for arch 'riscv64'"):
        ctx.wheel_pin("riscv64")
    with pytest.raises(Fail, match=r"pins\.toml: no sdist pinned"):
        _ = ctx.but(pins=tuple(a for a in ctx.pins if a.role != "sdist")).sdist_pin
    one = ctx.but(pins=tuple(a for a in ctx.pins if a.arch != "aarch64"))
    assert one.arches == ["x86_64"] and ctx.arches == ["aarch64", "x86_64"]  # a copy


def test_a_version_that_is_not_the_pinned_sdist_is_refused(tmp_path):
    src = get_line()
    folder = tmp_path / src.tag
    shutil.copytree(src.patches, folder)
    line = Line.at(folder)
    public = src.tag[1:]
    (folder / "VERSION").write_text(f"{public}.post1+tpfix.1\n")
    with pytest.raises(Fail, match=rf"public version {public}\.post1 is not pins\.toml's sdist"):
        BuildContext.resolve(line)
    (folder / "VERSION").write_text("not a version\n")
    with pytest.raises(Fail, match="is not a PEP 440 version"):
        BuildContext.resolve(line)


def test_a_release_answers_for_its_context(tmp_path):
    ctx = BuildContext.resolve(get_line())
    wheel = tmp_path / "dist" / "vllm.whl"
    rel = Release(ctx, wheel, tmp_path / "sdist", tmp_path / "official", "x86_64", 1)
    assert (rel.line, rel.version, rel.dist) == (ctx.line, ctx.version, tmp_path / "dist")


def test_an_input_edited_during_the_build_is_refused(tmp_path):
    """check_unchanged (the build runs it before it caches or describes a
    wheel): a patch, the series or pins.toml changed since the context was
    resolved stops the build, naming the folder; unchanged passes."""
    src = get_line()
    for edit in ("patch", "series", "pins.toml"):
        folder = tmp_path / edit / src.tag
        shutil.copytree(src.patches, folder)
        line = Line.at(folder)
        ctx = BuildContext.resolve(line)
        ctx.check_unchanged()
        target = folder / (ctx.series[-1] if edit == "patch" else edit)
        target.write_bytes(target.read_bytes() + b"\n")
        with pytest.raises(Fail, match=r"changed during the build .*run ./build.sh again"):
            ctx.check_unchanged()


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    folder = tmp_path / get_line().tag
    shutil.copytree(get_line().patches, folder)
    (folder / "series").write_bytes(b"\xff\xfe0001.patch\n")
    with pytest.raises(Fail, match=r"series: not UTF-8"):
        BuildContext.resolve(Line.at(folder))
