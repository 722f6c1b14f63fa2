# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The release-line data model (tpfix/core/lines.py), on the committed data and on
made-up lines in tmp_path.

Every committed line (line_names()): its VERSION names its folder's tag as
<tag without v>+tpfix.<n>; the top-level VERSION picks the default line;
newest_line() is the highest version; the pins hold one sdist and one wheel
per arch with a 64-hex sha256; the revision checks find nothing wrong.  Then
each reader's refusals (read_version, the pin files, get_line,
revision_number), the fingerprint (what the line ships, every byte of every
patch file, its header included: docs/developing.md "Header-only edits bump
the revision too"), the changelog reader, image_tag and dist_state.  Made-up
lines live in tmp_path with lines.LINES/TAG/PINS monkeypatched; the real tree
is only read.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from tpfix.core import lines
from tpfix.core.lines import (
    Line,
    changelog_entries,
    dist_state,
    fingerprint,
    get_line,
    image_tag,
    line_names,
    load_pins,
    newest_line,
    newest_line_before,
    read_pin_file,
    read_version,
    revision_number,
    revision_problems,
    sdist_pin,
    tag_of,
    wheel_arches,
    wheel_pin,
)
from tpfix.core.patch_format import read_series, split
from tpfix.core.util import ROOT, Fail

NAMES = line_names()
HEX64 = re.compile(r"[0-9a-f]{64}")


def _copy(name: str, tmp_path: Path) -> Line:
    """A copy of line `name` in a folder named like it (under tmp_path)."""
    folder = tmp_path / "patches" / name
    shutil.copytree(get_line(name).patches, folder)
    return Line.at(folder)


def _made_up(
    lines_dir: Path, tag: str, version: str | None = None, sdist: str | None = None
) -> Path:
    """A made-up line folder patches/<tag>/ with a VERSION, a pins.toml
    pinning one sdist (of version `sdist`, the tag's by default) and a
    series naming one small patch."""
    folder = lines_dir / tag
    folder.mkdir(parents=True)
    (folder / "VERSION").write_text((version or f"{tag[1:]}+tpfix.1") + "\n")
    (folder / "pins.toml").write_text(
        f'tag = "{tag}"\n\n[[artifact]]\nproject = "vllm"\nversion = "{sdist or tag[1:]}"\n'
        f'role = "sdist"\nfilename = "vllm-{tag[1:]}.tar.gz"\nsize = 1\nsha256 = "{"a" * 64}"\n'
    )
    (folder / "series").write_text("0001-x.patch\n")
    (folder / "0001-x.patch").write_text("Subject: x\n\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n")
    return folder


@pytest.fixture
def made_up(tmp_path: Path, monkeypatch) -> Path:
    """An empty patches/ of made-up lines, installed as lines.LINES (with
    lines.PINS an empty pins/ beside it)."""
    root = tmp_path / "patches"
    root.mkdir()
    (tmp_path / "pins").mkdir()
    monkeypatch.setattr(lines, "LINES", root)
    monkeypatch.setattr(lines, "PINS", tmp_path / "pins")
    return root


# -- the committed lines -------------------------------------------------------------


def test_there_are_lines_and_each_is_named_once():
    assert NAMES, "no release line found under patches/"
    assert len(set(NAMES)) == len(NAMES), NAMES
    folders = {d.name for d in (ROOT / "patches").iterdir() if (d / "VERSION").exists()}
    assert set(NAMES) == folders


@pytest.mark.parametrize("name", NAMES)
def test_each_lines_version_names_its_folders_tag(name: str):
    line = get_line(name)
    assert line.patches == ROOT / "patches" / name
    text = line.version_file.read_text()
    assert text.endswith("\n") and text.count("\n") == 1, repr(text)
    m = re.fullmatch(r"(.+)\+tpfix\.(\d+)", text.strip())
    assert m, f"{line.version_file}: {text!r} is not <upstream>+tpfix.<n>"
    assert "v" + m.group(1) == name
    assert line.tag == tag_of(line.version_file) == name
    assert line.version == read_version(line.version_file) == text.strip()
    v = Version(line.version)
    assert v.public == name[1:] and v.local == f"tpfix.{m.group(2)}"
    assert revision_number(line, line.version) == int(m.group(2))


def test_the_default_line_is_the_top_level_versions():
    tag = (ROOT / "VERSION").read_text().strip()
    default = get_line()
    assert default.tag == tag and default == get_line(tag)
    assert NAMES[0] == tag
    assert [n for n in NAMES if get_line(n).is_default] == [tag]
    assert default.dist == ROOT / "dist" and default.workdir == ROOT / "build" / "work"
    for other in NAMES[1:]:
        line = get_line(other)
        assert line.dist == ROOT / "dist" / other
        assert line.workdir == ROOT / "build" / f"work-{other}"


def test_the_other_lines_follow_by_version_and_the_newest_is_the_highest():
    rest = [Version(n[1:]) for n in NAMES[1:]]
    assert rest == sorted(rest)
    newest = newest_line()
    assert newest in NAMES
    assert all(Version(n[1:]) <= Version(newest[1:]) for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_line_pins_one_sdist_and_one_wheel_per_arch(name: str):
    line = get_line(name)
    arts = load_pins(line.pins)
    assert read_pin_file(line.pins)["tag"] == name
    for a in arts:
        assert HEX64.fullmatch(a.sha256), a
        if a.role == "test":  # a test input start_line pinned (the FlashInfer the tag pins)
            assert a.project != "vllm", a
            continue
        assert a.size > 0 and a.project == "vllm" and a.version == name[1:], a
    (sdist,) = [a for a in arts if a.role == "sdist"]
    assert sdist_pin(name) == sdist
    assert sdist.is_sdist and sdist.filename == f"vllm-{name[1:]}.tar.gz"
    wheels = [a for a in arts if a.role == "wheel"]
    assert wheels, f"{line.pins}: no official wheel pinned"
    arches = [w.arch for w in wheels]
    assert len(set(arches)) == len(arches), arches
    for w in wheels:
        assert wheel_pin(w.arch, name) == w
        assert not w.is_sdist and w.filename.endswith(f"-{w.platform}.whl"), w
        assert w.filename.startswith(f"vllm-{name[1:]}-") and w.arch in w.platform
    with pytest.raises(Fail, match=r"no official wheel pinned for arch 'sparc'"):
        wheel_pin("sparc", name)
    assert re.fullmatch(r"\d+\.\d+", line.official_cuda())
    assert line.official_image == f"vllm/vllm-openai:{name}"


@pytest.mark.parametrize("name", NAMES)
def test_each_committed_line_has_no_revision_problem(name: str):
    line = get_line(name)
    assert revision_problems(line) == []
    listed = [v for v, _ in changelog_entries(line)]
    assert listed[0] == line.version
    numbers = [revision_number(line, v) for v in listed]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)


@pytest.mark.parametrize("name", NAMES)
def test_image_tag_is_a_valid_container_tag_of_the_version(name: str):
    version = get_line(name).version
    repo, _, tag = image_tag(version).partition(":")
    assert repo == "vllm-openai"
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag), tag  # no '+' in a tag
    assert tag.replace("-", "+", 1) == "v" + version  # the version is recoverable
    assert image_tag(version) != image_tag(version.replace("tpfix.", "tpfix.1"))


# -- made-up lines: line_names, newest_line, get_line's refusals -----------------------------


def test_lines_sort_by_version_not_by_name(made_up: Path, monkeypatch):
    for tag in ("v0.2.0", "v0.9.0", "v0.10.0", "v0.10.0rc1"):
        _made_up(made_up, tag)
    (made_up / "vnext").mkdir()  # not named like a tag
    (made_up / "vnext" / "VERSION").write_text("0.11.0+tpfix.1\n")
    (made_up / "v1.0.0").mkdir()  # no VERSION: not a line
    monkeypatch.setattr(lines, "TAG", "v0.9.0")
    assert line_names() == ["v0.9.0", "v0.2.0", "v0.10.0rc1", "v0.10.0"]
    assert newest_line() == "v0.10.0"  # by version: as text v0.9.0 is the greatest
    monkeypatch.setattr(lines, "TAG", "v0.10.0")
    assert line_names() == ["v0.10.0", "v0.2.0", "v0.9.0", "v0.10.0rc1"]
    assert newest_line() == "v0.10.0"
    assert get_line().tag == "v0.10.0" and get_line().is_default
    assert not get_line("v0.2.0").is_default
    assert get_line("v0.10.0rc1").version == "0.10.0rc1+tpfix.1"
    # what a new line starts from: the newest line of an older release
    assert newest_line_before("v0.11.0") == "v0.10.0"
    assert newest_line_before("v0.10.0") == "v0.10.0rc1"
    assert newest_line_before("v0.9.1") == "v0.9.0"  # by version: as text v0.10.0 is older
    assert newest_line_before("v0.2.0") is None
    assert newest_line_before("vnext") is None


def test_get_line_refuses_what_is_not_a_line(made_up: Path, monkeypatch):
    _made_up(made_up, "v1.0.0")
    monkeypatch.setattr(lines, "TAG", "v1.0.0")
    with pytest.raises(Fail) as e:
        get_line("v2.0.0")
    assert "no release line 'v2.0.0'" in str(e.value) and "lines: v1.0.0" in str(e.value)
    # a folder copied by hand whose VERSION still names the tag it was copied from
    shutil.copytree(made_up / "v1.0.0", made_up / "v1.1.0")
    with pytest.raises(Fail) as e:
        get_line("v1.1.0")
    assert "names v1.0.0, not the folder's tag v1.1.0; write 1.1.0+tpfix.<n> there" in str(e.value)
    (made_up / "v1.1.0" / "VERSION").write_text("1.1.0+tpfix.1\n")
    for need in ("series", "pins.toml"):
        (made_up / "v1.1.0" / need).unlink()
        with pytest.raises(Fail, match=f"v1.1.0/{need} is missing: a line folder holds"):
            get_line("v1.1.0")
    # the top-level VERSION naming no line folder, or not a tag at all
    for bad in ("v3.0.0", "latest", ""):
        monkeypatch.setattr(lines, "TAG", bad)
        with pytest.raises(Fail) as e:
            get_line()
        assert f"{bad!r} names no release line; write the tag" in str(e.value)


def test_tag_of_reads_the_public_part():
    for name in NAMES:
        assert tag_of(get_line(name).version_file) == name


# -- read_version and the pin files -------------------------------------------------


@pytest.mark.parametrize(
    "text,message",
    [
        ("{pub}-tpfix", "'{pub}-tpfix' is not a PEP 440 version"),
        ("", "'' is not a PEP 440 version"),
        ("v{pub}+tpfix.1", "write the normalized form '{pub}+tpfix.1'"),
        ("{pub}+TPFIX.1", "write the normalized form '{pub}+tpfix.1'"),
        ("{pub}+tpfix-1", "write the normalized form '{pub}+tpfix.1'"),
        ("{pub}", "'{pub}' needs the local label +tpfix.<n>"),
        ("{pub}+other.1", "'{pub}+other.1' needs the local label +tpfix.<n>"),
        ("{pub}+tpfixed.1", "'{pub}+tpfixed.1' needs the local label +tpfix.<n>"),
        ("{pub}.post1+tpfix.1", "public version {pub}.post1 has no pins"),
    ],
)
@pytest.mark.parametrize("name", NAMES)
def test_read_version_refuses(name: str, text: str, message: str, tmp_path: Path):
    pub = name[1:]
    f = tmp_path / "VERSION"
    f.write_text(text.format(pub=pub) + "\n")
    with pytest.raises(Fail) as e:
        read_version(f)
    assert str(e.value).startswith(f"{f}: ") and message.format(pub=pub) in str(e.value)


def test_read_version_refuses_a_missing_file_and_a_foreign_sdist(made_up: Path):
    with pytest.raises(Fail, match="is not a PEP 440 version"):
        read_version(made_up / "nowhere" / "VERSION")
    folder = _made_up(made_up, "v1.0.0", sdist="1.0.1")  # pins.toml of another release
    with pytest.raises(Fail, match=r"public version 1\.0\.0 is not pins\.toml's sdist 1\.0\.1"):
        read_version(folder / "VERSION")
    # a tag with no line: its pins come from pins/<tag>.toml
    f = made_up / "VERSION"
    f.write_text("2.0.0+tpfix.3\n")
    with pytest.raises(Fail, match=r"public version 2\.0\.0 has no pins \(v2\.0\.0\.toml"):
        read_version(f)
    (lines.PINS / "v2.0.0.toml").write_text(
        (folder / "pins.toml").read_text().replace('"1.0.1"', '"2.0.0"')
    )
    assert read_version(f) == "2.0.0+tpfix.3"


def test_pin_files_refuse_what_is_not_a_pin(tmp_path: Path):
    good = sdist_pin(get_line().tag)
    entry = (
        f'project = "{good.project}"\nversion = "{good.version}"\nrole = "{good.role}"\n'
        f'filename = "{good.filename}"\nsize = {good.size}\n'
    )
    pins = tmp_path / "pins.toml"
    with pytest.raises(Fail, match="pins.toml: pin file missing"):
        load_pins(pins)
    pins.write_text("[[artifact]\n")
    with pytest.raises(Fail, match="pins.toml: not valid TOML"):
        read_pin_file(pins)
    bad_shas = [good.sha256[:-1], good.sha256.upper(), "g" * 64, good.sha256 + "0"]
    for sha in bad_shas:
        pins.write_text(f'[[artifact]]\n{entry}sha256 = "{sha}"\n')
        with pytest.raises(Fail, match=f"artifact {re.escape(good.filename)} has no valid sha256"):
            load_pins(pins)
    pins.write_text(f'[[artifact]]\n{entry}sha256 = "{good.sha256}"\ncolour = "red"\n')
    with pytest.raises(Fail, match=r"artifact #1 is malformed .*colour"):
        load_pins(pins)
    pins.write_text(f'[[artifact]]\n{entry}sha256 = "{good.sha256}"\n')
    assert load_pins(pins) == [good]
    pins.write_text("")
    assert load_pins(pins) == []
    with pytest.raises(Fail, match=r"no `cuda = \"MAJOR.MINOR\"`"):
        Line(tmp_path / "VERSION", pins, tmp_path).official_cuda()


# -- fingerprint, changelog, revision -------------------------------------------------


def _last_patch(line: Line) -> Path:
    return line.patches / read_series(line.series)[-1]


@pytest.mark.parametrize("name", NAMES)
def test_the_fingerprint_is_what_the_line_ships(name: str, tmp_path: Path):
    a, b = _copy(name, tmp_path / "a"), _copy(name, tmp_path / "b")
    before = fingerprint(a)
    assert HEX64.fullmatch(before)
    assert fingerprint(b) == before == fingerprint(get_line(name))  # bytes, not the place
    # what it does not ship: the changelog, VERSION, advisories, a file no series names
    (a.patches / "CHANGELOG.md").write_text("## anything\n")
    a.version_file.write_text(a.version_file.read_text().replace("tpfix.", "tpfix.9"))
    (a.patches / "advisories.toml").write_text("")
    (a.patches / "9999-not-in-the-series.patch").write_text("--- a/x\n+++ b/x\n")
    assert fingerprint(a) == before
    # what it does ship: a patch's diff, its order in the series, pins.toml
    patch = _last_patch(b)
    original = patch.read_bytes()
    header, diff = split(original.decode())
    patch.write_text(header + re.sub(r"(?m)^\+(?!\+\+ )", "+ ", diff, count=1))
    assert fingerprint(b) != before
    patch.write_bytes(original)
    assert fingerprint(b) == before
    names = read_series(b.series)
    if len(names) > 1:
        b.series.write_text("".join(f"{n}\n" for n in reversed(names)))
        assert fingerprint(b) != before
        b.series.write_bytes(get_line(name).series.read_bytes())
    b.pins.write_text(b.pins.read_text() + "\n# a comment\n")
    assert fingerprint(b) != before


@pytest.mark.parametrize("name", NAMES)
def test_a_header_only_edit_changes_the_fingerprint(name: str, tmp_path: Path):
    """docs/developing.md, "Header-only edits bump the revision too": the
    fingerprint covers every byte of a patch file, so an edit of its header
    alone (the diff unchanged) is a change the revision check reports."""
    line = _copy(name, tmp_path)
    before = fingerprint(line)
    patch = _last_patch(line)
    header, diff = split(patch.read_text())
    assert header and diff
    edited = header.replace("\n\n", "\n\nA reviewer's typo fixed.\n", 1)
    assert edited != header
    patch.write_text(edited + diff)
    assert split(patch.read_text())[1] == diff  # the diff is untouched
    assert fingerprint(line) != before
    (said,) = revision_problems(line)
    assert "the series, a patch or pins.toml changed since" in said
    assert f"run: python -m tpfix.maint.revision bump {name}" in said


def test_changelog_entries_are_the_level_two_headings(tmp_path: Path):
    line = Line.at(tmp_path)
    assert changelog_entries(line) == []  # no CHANGELOG.md
    line.changelog.write_text(
        "# the line: changelog\n\nintro\n\n"
        "## 1.0.0+tpfix.3  \n\nthird\n### a sub-heading\nmore\n"
        "## two words\nnot an entry heading\n"
        "## 1.0.0+tpfix.1\nfirst\n"
    )
    assert changelog_entries(line) == [
        (
            "1.0.0+tpfix.3",
            "\n\nthird\n### a sub-heading\nmore\n## two words\nnot an entry heading\n",
        ),
        ("1.0.0+tpfix.1", "\nfirst\n"),
    ]


@pytest.mark.parametrize("name", NAMES)
def test_revision_number_refuses_another_lines_or_unnormalized_version(name: str):
    line = get_line(name)
    pub = name[1:]
    assert revision_number(line, f"{pub}+tpfix.12") == 12
    others = [n for n in NAMES if n != name] + ["v99.0.0"]
    for bad in [
        f"{others[0][1:]}+tpfix.1",
        f"{pub}+tpfix.01",
        f"{pub}+tpfix.x",
        f"{pub}+other.1",
        pub,
    ]:
        with pytest.raises(Fail, match=rf"entry '{re.escape(bad)}' is not {re.escape(pub)}\+"):
            revision_number(line, bad)


@pytest.mark.parametrize("name", NAMES)
def test_revision_problems_of_a_copy_whose_version_is_ahead(name: str, tmp_path: Path):
    line = _copy(name, tmp_path)
    assert revision_problems(line) == []
    newest = changelog_entries(line)[0][0]
    ahead = f"{name[1:]}+tpfix.{revision_number(line, newest) + 1}"
    line.version_file.write_text(ahead + "\n")
    (said,) = revision_problems(line)
    assert f"VERSION: {ahead}, but " in said
    assert f"CHANGELOG.md's newest entry is {newest}; write the entry or run: " in said


@pytest.mark.parametrize("name", NAMES)
def test_revision_problems_of_a_changelog_without_entry_or_fingerprint(name: str, tmp_path: Path):
    line = _copy(name, tmp_path)
    text = line.changelog.read_text()
    line.changelog.write_text(text.split("\n## ", 1)[0])  # the intro only
    (said,) = revision_problems(line)
    assert "no `## <version>` entry" in said and f"bump {name}" in said
    line.changelog.write_text(re.sub(r"(?m)^fingerprint: .*\n", "", text, count=1))
    (said,) = revision_problems(line)
    assert f"the newest entry {line.version} records no `fingerprint: sha256:<hex>`" in said


# -- dist_state ------------------------------------------------------------------------


def test_dist_state_is_one_folder_per_output_folder_outside_it(tmp_path: Path):
    a, b = tmp_path / "x" / "dist", tmp_path / "y" / "dist"
    a.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "x")
    state = dist_state(a)
    assert state.parent == ROOT / "build" / "dists"
    assert state.name.startswith("dist-") and not state.is_relative_to(a)
    # the same folder, however spelt: the same state; another folder of the same name: another
    assert dist_state(tmp_path / "y" / ".." / "x" / "dist") == state
    assert dist_state(tmp_path / "link" / "dist") == state
    assert dist_state(b) != state and dist_state(b).name.startswith("dist-")
    assert not (ROOT / "build" / "dists" / state.name).exists()  # it only names the folder


@pytest.mark.parametrize("name", NAMES)
def test_wheel_arches_are_those_the_pins_list(name: str):
    pinned = {a.arch for a in load_pins(get_line(name).pins) if a.role == "wheel"}
    assert pinned and wheel_arches(name) == sorted(pinned)
    assert set(wheel_arches()) >= pinned  # the --arch choices: every line's


def test_wheel_arches_leave_out_a_line_without_pins(made_up: Path):
    """A line folder without pins.toml is left out of the union (argparse's
    --arch choices must not fail before get_line names the folder), and is
    named when asked for by tag."""
    (made_up / "v9.9.9").mkdir()
    (made_up / "v9.9.9" / "VERSION").write_text("9.9.9+tpfix.1\n")
    assert wheel_arches() == []
    with pytest.raises(Fail, match="pin file missing"):
        wheel_arches("v9.9.9")
