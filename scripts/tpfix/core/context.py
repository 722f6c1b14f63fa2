# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""One build's inputs, resolved once: the release line with its version, its
series, its pins and the arches they list (BuildContext), and what the build
of one arch made of them (Release).

./build.sh resolves the context once (pipeline.main), before any download,
and every stage receives it: fetch takes its pins, patch its series, build
its version and CUDA, verify its series' files, package its version, series
and pins, the image the Release that carries it.  No stage reads the line's
VERSION, series or pins.toml again, and an --arch all build shares one
context between its arches."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tpfix.core.lines import (
    Artifact,
    Line,
    arches_of,
    fingerprint,
    pin_artifacts,
    read_pin_file,
    read_version,
    sdist_of,
    wheel_of,
)
from tpfix.core.patch_format import parse_series
from tpfix.core.util import Fail, shown


@dataclass(frozen=True)
class BuildContext:
    line: Line
    version: str  # the line's VERSION, validated (lines.read_version)
    series: tuple[str, ...]  # the patch names of its series, in order
    pins: tuple[Artifact, ...]  # its pins.toml: the sdist and the official wheels
    cuda: str  # the CUDA version of those wheels (pins.toml's `cuda`)
    fingerprint: str  # of what the line ships (lines.fingerprint), as read here

    @classmethod
    def resolve(cls, line: Line) -> BuildContext:
        """Read the line's VERSION, series and pins.toml, each once (get_line
        checked that the three exist)."""
        series, pin_bytes = line.series.read_bytes(), line.pins.read_bytes()
        data = read_pin_file(line.pins, _text(line.pins, pin_bytes))
        pins = pin_artifacts(data, line.pins)
        return cls(
            line=line,
            version=read_version(line.version_file, pins),
            series=tuple(parse_series(_text(line.series, series))),
            pins=tuple(pins),
            cuda=line.official_cuda(data),
            fingerprint=fingerprint(line, series, pin_bytes),
        )

    def check_unchanged(self) -> None:
        """Fail unless the line still ships what was resolved (its
        fingerprint): a patch, the series or pins.toml edited during the build
        would otherwise be built, cached and described as the inputs read
        before.  The build checks it before it caches or describes a wheel."""
        now = fingerprint(self.line)
        if now != self.fingerprint:
            raise Fail(
                f"{shown(self.line.patches)}: the series, a patch or pins.toml changed "
                f"during the build (fingerprint {self.fingerprint[:12]} -> {now[:12]}); "
                "nothing was published: run ./build.sh again"
            )

    def but(self, **changes) -> BuildContext:
        """A copy with `changes` (a test's wrong version, a shorter series)."""
        return dataclasses.replace(self, **changes)

    @property
    def tag(self) -> str:
        return self.line.tag

    @property
    def arches(self) -> list[str]:
        """The arches of the official wheels the pins list (--arch all)."""
        return arches_of(self.pins)

    @property
    def sdist_pin(self) -> Artifact:
        return sdist_of(self.pins, self.line.pins)

    def wheel_pin(self, arch: str) -> Artifact:
        return wheel_of(self.pins, arch, self.line.pins)


def _text(path: Path, data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise Fail(f"{shown(path)}: not UTF-8 ({e})") from None


@dataclass(frozen=True)
class Release:
    """What the build of one arch made: the published wheel (in its dist
    folder) and the inputs it was built from (the sdist, the official wheel
    of `arch`) with its epoch, under the context it was built in.
    ./build.sh --image hands over its own (pipeline); python -m tpfix.image
    reads dist/ once (image.release_in)."""

    ctx: BuildContext
    wheel: Path
    sdist: Path
    official: Path
    arch: str
    epoch: int

    @property
    def line(self) -> Line:
        return self.ctx.line

    @property
    def version(self) -> str:
        return self.ctx.version

    @property
    def dist(self) -> Path:
        return self.wheel.parent
