# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The release lines and their pins: the model of the data in patches/<tag>/
and pins/ (Line, Artifact, the pin files, the distribution version), and
where a line's builds go (dist_state, image_tag).  One build's inputs,
resolved once, are tpfix.core.context's."""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tpfix.core.patch_format import parse_series
from tpfix.core.util import ROOT, Fail, shown

# Every release line is one folder patches/<tag>/ of the same shape (Line).
LINES = ROOT / "patches"


# Pins shared by every line (flashinfer.toml), and those of a tag with no line yet.
PINS = ROOT / "pins"


# The one pointer to the default line: the top-level VERSION holds its tag.
DEFAULT_FILE = ROOT / "VERSION"


def tag_of(version_file: Path) -> str:
    """The upstream tag a line's VERSION file names (its public part);
    read_version() validates the file fully, this only reads it."""
    text = version_file.read_text().strip() if version_file.exists() else ""
    return "v" + text.split("+")[0]


def default_tag() -> str:
    """The default line's tag: the content of the top-level VERSION."""
    text = DEFAULT_FILE.read_text().strip() if DEFAULT_FILE.exists() else ""
    return text


# The default line's tag (the top-level VERSION names it; its folder is patches/<TAG>/).
TAG = default_tag()


# The local version label that names this distribution: <upstream>+<LABEL>.<n>.
LABEL = "tpfix"


@dataclass(frozen=True)
class Artifact:
    project: str
    version: str
    role: str  # "sdist", "wheel" or "test"
    filename: str
    size: int
    sha256: str
    arch: str | None = None
    platform: str | None = None

    @property
    def is_sdist(self) -> bool:
        return self.filename.endswith((".tar.gz", ".zip"))


def read_pin_file(path: Path, text: str | None = None) -> dict:
    """A pin file's TOML (its `text`, when read already): the one reader of
    pin files (load_pins, a line's `cuda`, the support matrix's facts)."""
    try:
        return tomllib.loads(path.read_text() if text is None else text)
    except FileNotFoundError:
        raise Fail(f"{path}: pin file missing") from None
    except tomllib.TOMLDecodeError as e:
        raise Fail(f"{path}: not valid TOML ({e})") from None


def load_pins(path: Path) -> list[Artifact]:
    return pin_artifacts(read_pin_file(path), path)


def pin_artifacts(data: dict, path: Path) -> list[Artifact]:
    """The artifacts of pin file `path`'s TOML `data`, each checked."""
    arts = []
    for i, entry in enumerate(data.get("artifact", [])):
        try:
            art = Artifact(**entry)
        except TypeError as e:
            raise Fail(f"{path}: artifact #{i + 1} is malformed ({e})") from None
        if len(art.sha256) != 64 or any(c not in "0123456789abcdef" for c in art.sha256):
            raise Fail(f"{path}: artifact {art.filename} has no valid sha256")
        arts.append(art)
    return arts


@dataclass(frozen=True)
class Line:
    """A release line: one upstream tag with its pins, its series and its version.

    Every line is one folder, patches/<tag>/, holding data only (the tooling is
    shared): series and its patches, pins.toml, VERSION (<upstream>+tpfix.<n>),
    CHANGELOG.md, advisories.toml and, for a line made by maint.start_line,
    rebase.json.  The default line is named by the top-level VERSION (its tag).
    """

    version_file: Path
    pins: Path
    patches: Path

    @classmethod
    def at(cls, folder: Path) -> Line:
        return cls(folder / "VERSION", folder / "pins.toml", folder)

    @property
    def series(self) -> Path:
        return self.patches / "series"

    @property
    def changelog(self) -> Path:
        return self.patches / "CHANGELOG.md"

    @property
    def version(self) -> str:
        """The line's distribution version: its VERSION, validated."""
        return read_version(self.version_file)

    @property
    def tag(self) -> str:
        return tag_of(self.version_file)

    @property
    def is_default(self) -> bool:
        return self.tag == TAG

    @property
    def dist(self) -> Path:
        """Where ./build.sh writes the line's wheel by default: dist/ (dist/<tag>/)."""
        return ROOT / "dist" if self.is_default else ROOT / "dist" / self.tag

    @property
    def workdir(self) -> Path:
        """The build's default work folder: build/work (build/work-<tag>)."""
        return ROOT / "build" / ("work" if self.is_default else f"work-{self.tag}")

    @property
    def official_image(self) -> str:
        """The official image of the line's tag: the default base of ours."""
        return f"vllm/vllm-openai:{self.tag}"

    def official_cuda(self, data: dict | None = None) -> str:
        """The CUDA version the official wheels of this tag were built for
        (from pins.toml, or its TOML `data` already read)."""
        cuda = (read_pin_file(self.pins) if data is None else data).get("cuda")
        if not isinstance(cuda, str):
            raise Fail(f'{self.pins}: no `cuda = "MAJOR.MINOR"` of the official wheels')
        return cuda


def tag_version(name: str) -> Version | None:
    """The upstream version a tag names (v0.33.0: 0.33.0); None for a name
    that is not a release tag."""
    try:
        return Version(name[1:]) if name.startswith("v") else None
    except InvalidVersion:
        return None


def line_tags(lines: Path | None = None) -> list[str]:
    """The tags of the release lines in `lines` (a patches/ folder; LINES, this
    repository's, by default), by version: its folders named like a tag that
    hold a VERSION (the others are not lines)."""
    folder = LINES if lines is None else lines
    found = [d.name for d in folder.glob("v*") if (d / "VERSION").exists() and tag_version(d.name)]
    return sorted(found, key=tag_version)


def line_names() -> list[str]:
    """Every release line, the default first, then the others by version."""
    return [TAG, *(n for n in line_tags() if n != TAG)]


def newest_line() -> str:
    """The line of the newest upstream release (what goes upstream, and what a
    new line starts from), whichever line is the default."""
    return max(line_names(), key=tag_version)


def newest_line_before(tag: str) -> str | None:
    """The line of the newest upstream release older than `tag` (what a new
    line for `tag` starts from: maint.start_line); None when there is none."""
    want = tag_version(tag)
    older = [n for n in line_names() if want and tag_version(n) < want]
    return max(older, key=tag_version, default=None)


def get_line(name: str | None = None) -> Line:
    """The release line `name` (a tag such as v0.33.0); None is the default
    (the tag the top-level VERSION names).

    A line folder must hold VERSION (naming the folder's tag), pins.toml and
    series; anything else is an error naming the file and the fix.
    """
    if name is None:
        name = TAG
        if not tag_version(name) or not (LINES / name / "VERSION").exists():
            raise Fail(
                f"{shown(DEFAULT_FILE)}: {name!r} names no release line; write the tag "
                f"of one folder of patches/ there (e.g. v0.27.1)"
            )
    folder = LINES / name
    if not (folder / "VERSION").exists():
        raise Fail(
            f"no release line {name!r} ({shown(folder)}/VERSION is missing); "
            f"lines: {', '.join(line_names())}"
        )
    line = Line.at(folder)
    if line.tag != name:
        raise Fail(
            f"{shown(line.version_file)}: names {line.tag}, not the folder's tag {name}; "
            f"write {name[1:]}+{LABEL}.<n> there"
        )
    for need in (line.pins, line.series):
        if not need.exists():
            raise Fail(f"{shown(need)} is missing: a line folder holds VERSION, pins.toml, series")
    return line


def tag_pins(tag: str) -> Path:
    """The pin file of `tag`: its line's, or pins/<tag>.toml for a tag with no line."""
    if (LINES / tag / "pins.toml").exists():
        return LINES / tag / "pins.toml"
    return PINS / f"{tag}.toml"


def sdist_of(pins: Iterable[Artifact], where: Path) -> Artifact:
    """The sdist among `pins` (those of pin file `where`)."""
    for a in pins:
        if a.role == "sdist":
            return a
    raise Fail(f"{shown(where)}: no sdist pinned")


def wheel_of(pins: Iterable[Artifact], arch: str, where: Path) -> Artifact:
    """The official wheel of `arch` among `pins` (those of pin file `where`)."""
    for a in pins:
        if a.role == "wheel" and a.arch == arch:
            return a
    raise Fail(f"{shown(where)}: no official wheel pinned for arch {arch!r}")


def arches_of(pins: Iterable[Artifact]) -> list[str]:
    """The arches of the official wheels among `pins`."""
    return sorted({a.arch for a in pins if a.role == "wheel"})


def sdist_pin(tag: str) -> Artifact:
    return sdist_of(load_pins(tag_pins(tag)), tag_pins(tag))


def wheel_pin(arch: str, tag: str) -> Artifact:
    return wheel_of(load_pins(tag_pins(tag)), arch, tag_pins(tag))


def wheel_arches(tag: str | None = None) -> list[str]:
    """The arches of the official wheels pinned for `tag` or, without one,
    for any line (the choices of an --arch argument)."""
    arches: set[str] = set()
    for t in [tag] if tag else line_names():
        try:
            arches |= set(arches_of(load_pins(tag_pins(t))))
        except Fail:
            if tag:
                raise
            # a broken line folder: get_line names what is wrong where it is used
    return sorted(arches)


def read_version(path: Path, pins: list[Artifact] | None = None) -> str:
    """The distribution version: PEP 440, <upstream>+<LABEL>.<n>, from a line's
    VERSION file; its upstream part is the pinned sdist's (of `pins`, the
    line's pins read already, or of the pin file of that version's tag)."""
    text = path.read_text().strip() if path.exists() else ""
    try:
        v = Version(text)
    except InvalidVersion:
        raise Fail(f"{path}: {text!r} is not a PEP 440 version") from None
    if str(v) != text:
        raise Fail(f"{path}: write the normalized form {str(v)!r}, not {text!r}")
    where = path.with_name("pins.toml")
    if pins is None:
        where = tag_pins(f"v{v.public}")
        if not where.exists():
            raise Fail(f"{path}: public version {v.public} has no pins ({where.name} is missing)")
        pins = load_pins(where)
    upstream = next((a.version for a in pins if a.role == "sdist"), None)
    if v.public != upstream:
        raise Fail(f"{path}: public version {v.public} is not {where.name}'s sdist {upstream}")
    if not v.local or not v.local.startswith(f"{LABEL}."):
        raise Fail(f"{path}: {text!r} needs the local label +{LABEL}.<n>")
    return text


def dist_state(dist: Path) -> Path:
    """build/dists/<name>-<hash of its path>/: what builds keep about the output
    folder `dist` (its lock, the image's build context and log), outside it,
    so that dist/ (and dist/<tag>/ within it) holds published files only."""
    dist = dist.resolve()
    key = hashlib.sha256(str(dist).encode()).hexdigest()[:12]
    return ROOT / "build" / "dists" / f"{dist.name}-{key}"


def image_tag(version: str) -> str:
    """Our image's default name for distribution version `version`."""
    return f"vllm-openai:v{version.replace('+', '-')}"


# A line's revision (the number after +tpfix.) and its CHANGELOG.md: bumped
# with python -m tpfix.maint.revision, checked by the build and the tests.
ENTRY = re.compile(r"^## (\S+)[ \t]*$", re.M)
FINGERPRINT = re.compile(r"^fingerprint: sha256:([0-9a-f]{64})[ \t]*$", re.M)


def fingerprint(line: Line, series: bytes | None = None, pins: bytes | None = None) -> str:
    """sha256 (hex) over what the line ships: its series file, each patch the
    series names (name and bytes, in order) and its pins.toml (the bytes of
    `series` and `pins`, where read already)."""
    series = line.series.read_bytes() if series is None else series
    pins = line.pins.read_bytes() if pins is None else pins
    h = hashlib.sha256()
    h.update(b"series\0" + series + b"\0")
    for name in parse_series(series.decode()):
        h.update(name.encode() + b"\0" + (line.patches / name).read_bytes() + b"\0")
    h.update(b"pins.toml\0" + pins + b"\0")
    return h.hexdigest()


def changelog_entries(line: Line) -> list[tuple[str, str]]:
    """(version, text below its heading) of each CHANGELOG.md entry, as listed."""
    text = line.changelog.read_text() if line.changelog.exists() else ""
    heads = list(ENTRY.finditer(text))
    ends = [m.start() for m in heads[1:]] + [len(text)]
    return [(m.group(1), text[m.end() : end]) for m, end in zip(heads, ends)]


def bump_command(line: Line) -> str:
    return f'python -m tpfix.maint.revision bump {line.tag} "what changed, for users"'


def revision_problems(line: Line) -> list[str]:
    """What is wrong with the line's revision and changelog ([] when nothing)."""
    log, hint = shown(line.changelog), f"run: {bump_command(line)}"
    found = changelog_entries(line)
    if not found:
        return [f"{log}: no `## <version>` entry; {hint}"]
    out = []
    listed = [v for v, _ in found]
    for newer, older in zip(listed, listed[1:]):
        if revision_number(line, newer) <= revision_number(line, older):
            out.append(f"{log}: {newer} is listed above {older}: revisions must strictly increase")
    version = read_version(line.version_file)
    if listed[0] != version:
        out.append(
            f"{shown(line.version_file)}: {version}, but {log}'s newest entry is {listed[0]}; "
            f"write the entry or {hint}"
        )
    m = FINGERPRINT.search(found[0][1])
    now = fingerprint(line)
    if not m:
        out.append(f"{log}: the newest entry {listed[0]} records no `fingerprint: sha256:<hex>`")
    elif m.group(1) != now:
        out.append(
            f"{shown(line.patches)}: the series, a patch or pins.toml changed since "
            f"{listed[0]} (fingerprint {now[:12]}, the changelog says {m.group(1)[:12]}); {hint}"
        )
    return out


def revision_number(line: Line, version: str) -> int:
    """The revision number of `version` (<upstream>+tpfix.<n>), checked."""
    m = re.fullmatch(rf"{re.escape(line.tag[1:])}\+{LABEL}\.(\d+)", version)
    if not m or str(Version(version)) != version:
        raise Fail(f"{shown(line.changelog)}: entry {version!r} is not {line.tag[1:]}+{LABEL}.<n>")
    return int(m.group(1))
