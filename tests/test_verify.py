# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 4, verify (scripts/tpfix/stages/verify.py), on small stand-in wheels made
here: an "official" wheel of the default line's upstream version and a
"patched" one of its distribution version, with a few hundred bytes of
made-up files at the paths the default line's series touches (and at paths
it does not), a made-up compiled binary and kernel, and a small patched tree
beside them.  The series data (which files the series touches) is the
default line's real one; the file contents are made up.

Tested: a patched wheel that differs from the official one only where
verify allows (series files equal to the patched tree, the version in the
dist-info name, METADATA and vllm/_version.py, RECORD, a Requires-Dist the
series re-pins) passes; each other difference is refused with a message
naming the file: a series file that is not the patched tree's (changed or
added), a missing file, a changed kernel, a _version.py without the version,
METADATA beyond the version, no dist-info at all; which projects count as
re-pinned (_changed_pins); which files the series touches.

Already tested elsewhere, not here: a changed .so, an added file outside the
series and a changed file outside the series on the real wheel (slow,
test_build.py::test_verify_rejects_changed_binary_and_unexpected_file); a
Requires-Dist the series does not pin, and a respelled one
(test_wheelfile.py::test_verify_flags_requires_dist_no_patch_pins).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line
from tpfix.core.patch_format import read_series
from tpfix.stages.verify import _changed_pins, touched_files, verify_wheel

LINE = get_line()
UPSTREAM = LINE.tag.removeprefix("v")  # the official wheel's version
VERSION = LINE.version  # ours: UPSTREAM+tpfix.<n>
SERIES = sorted(f for f in touched_files(LINE) if f.startswith("vllm/"))
CHANGED, ADDED = SERIES[0], SERIES[1]  # one the official wheel has, one it lacks
UNTOUCHED = "vllm/__init__.py"
BINARY, KERNEL = "vllm/_C.abi3.so", "vllm/kernels/attention.cubin"
DEP = "tpfix-standin-dep"  # a made-up project the requirements re-pin


def _metadata(version: str, requires=(), fields=(), description="The stand-in.") -> str:
    head = ["Metadata-Version: 2.1", "Name: vllm", f"Version: {version}", *fields]
    head += [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(head) + f"\n\n{description}\n"


def _wheel(path: Path, version: str, files: dict[str, bytes], metadata: str | None = None):
    """A wheel (zip) of `files` and a vllm-<version>.dist-info (METADATA,
    WHEEL, RECORD); tests/wheels.py's make_wheel writes the version into
    vllm/__init__.py, a file verify must see unchanged, so it is not used."""
    info = f"vllm-{version}.dist-info"
    entries = dict(files)
    if metadata is not None:
        entries[f"{info}/METADATA"] = metadata.encode()
        entries[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\n"
        entries[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in entries).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


OFFICIAL_FILES = {
    UNTOUCHED: b"# upstream, not touched by the series\n",
    CHANGED: b"# upstream text of a file the series changes\n",
    BINARY: bytes(range(256)),
    KERNEL: b"\x7fELF a made-up kernel",
    "vllm/_version.py": f"__version__ = version = '{UPSTREAM}'\n".encode(),
}
PATCHED = {  # the patched tree's files
    CHANGED: b"# the series' text\n",
    ADDED: b"# a file the series adds\n",
}


@pytest.fixture
def made(tmp_path: Path):
    """(official wheel, patched tree, make(files=..., metadata=...) -> built wheel)."""
    assert len(SERIES) >= 2 and UNTOUCHED not in SERIES, SERIES
    official = _wheel(tmp_path / "official.whl", UPSTREAM, OFFICIAL_FILES, _metadata(UPSTREAM))
    tree = tmp_path / "tree"
    for name, data in PATCHED.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    good = {
        **OFFICIAL_FILES,
        **PATCHED,
        "vllm/_version.py": f"__version__ = version = '{VERSION}'\n".encode(),
    }

    def make(files=None, metadata=None, info_version=VERSION, **change):
        files = {**good, **change} if files is None else files
        files = {k: v for k, v in files.items() if v is not None}
        meta = _metadata(VERSION) if metadata is None else metadata
        return _wheel(tmp_path / "built.whl", info_version, files, meta or None)

    return official, tree, make


def _verify(built: Path, official: Path, tree: Path) -> list[str]:
    return verify_wheel(built, official, tree, BuildContext.resolve(LINE).but(version=VERSION))


def test_a_wheel_that_differs_only_where_allowed_passes(made):
    official, tree, make = made
    built = make()
    with zipfile.ZipFile(built) as b, zipfile.ZipFile(official) as o:
        differ = {n for n in o.namelist() if n in b.namelist() and b.read(n) != o.read(n)}
        assert set(b.namelist()) - set(o.namelist()) >= {ADDED, f"vllm-{VERSION}.dist-info/RECORD"}
    assert differ == {CHANGED, "vllm/_version.py"}  # the comparison below has work to do
    assert _verify(built, official, tree) == []


@pytest.mark.parametrize(
    "change,problem",
    [
        ({CHANGED: b"# other\n"}, f"{CHANGED}: patched file differs from the patched tree"),
        ({ADDED: b"# other\n"}, f"{ADDED}: added file differs from the patched tree"),
        ({UNTOUCHED: None}, f"{UNTOUCHED}: missing from the built wheel"),
        ({KERNEL: b"\x7fELF other"}, f"{KERNEL}: compiled binary differs from the official wheel"),
        (
            {"vllm/_version.py": f"__version__ = version = '{UPSTREAM}'\n# changed\n".encode()},
            f"vllm/_version.py: does not carry version {VERSION}",
        ),
    ],
    ids=["series-file-changed", "series-file-added", "missing", "kernel", "version-py"],
)
def test_each_other_difference_is_refused_naming_the_file(made, change, problem):
    official, tree, make = made
    assert _verify(make(**change), official, tree) == [problem]


@pytest.mark.parametrize(
    "metadata,problem",
    [
        (_metadata(f"{VERSION}0"), f"METADATA: Version is {VERSION}0, expected {VERSION}"),
        (
            _metadata(VERSION, fields=["Requires-Python: >=3.10"]),
            "METADATA: Requires-Python differs from the official wheel",
        ),
        (
            _metadata(VERSION, description="Another description."),
            "METADATA: description differs from the official wheel",
        ),
    ],
    ids=["version", "field", "description"],
)
def test_metadata_beyond_the_version_is_refused(made, metadata, problem):
    official, tree, make = made
    assert _verify(make(metadata=metadata), official, tree) == [problem]


@pytest.mark.parametrize("where", ["METADATA", "vllm/_version.py"])
def test_the_official_version_left_in_the_wheel_is_refused(made, where):
    """A build whose METADATA (or _version.py) still says the upstream
    version, byte for byte the official wheel's: a wheel that says it is
    upstream's: refused, although the file equals the official wheel's
    (verify_wheel once skipped equal files before its version checks)."""
    official, tree, make = made
    if where == "METADATA":
        built = make(metadata=_metadata(UPSTREAM))
        problem = f"METADATA: Version is {UPSTREAM}, expected {VERSION}"
    else:
        built = make(**{where: OFFICIAL_FILES[where]})
        problem = f"vllm/_version.py: does not carry version {VERSION}"
    assert _verify(built, official, tree) == [problem]


def test_a_dist_info_named_with_another_version_is_refused(made):
    official, tree, make = made
    assert _verify(make(), official, tree) == []
    problems = _verify(make(info_version=UPSTREAM), official, tree)
    assert problems == [f"vllm-{UPSTREAM}.dist-info: expected vllm-{VERSION}.dist-info"]


def test_a_wheel_without_dist_info_is_refused(made):
    official, tree, make = made
    problems = _verify(make(metadata=""), official, tree)
    assert problems[-1] == "no dist-info folder in the built wheel"
    missing = {"DIST-INFO/METADATA", "DIST-INFO/WHEEL", "DIST-INFO/RECORD"}
    assert {f"{n}: missing from the built wheel" for n in missing} <= set(problems)


def test_a_requirement_the_series_repins_may_change(made, tmp_path: Path):
    """A Requires-Dist may differ for a project named in a requirements file
    the series touches, as the patched tree has it; for no other."""
    reqs = sorted(f for f in touched_files(LINE) if f.startswith("requirements/"))
    official_meta = _metadata(UPSTREAM, requires=[f"{DEP}==1.0", "regex"])
    official = _wheel(tmp_path / "o" / "official.whl", UPSTREAM, OFFICIAL_FILES, official_meta)
    _, tree, make = made
    built = make(metadata=_metadata(VERSION, requires=[f"{DEP}==2.0", "regex"]))
    expected = [
        f"METADATA: Requires-Dist '{DEP}==1.0' changed, no patch pins it",
        f"METADATA: Requires-Dist '{DEP}==2.0' changed, no patch pins it",
    ]
    assert _verify(built, official, tree) == expected  # the tree does not name it yet
    # the same file outside what the series touches allows nothing
    (tree / "requirements").mkdir()
    (tree / "requirements" / "untouched-by-the-series.txt").write_text(f"{DEP}==2.0\n")
    assert _verify(built, official, tree) == expected
    if reqs:  # a line whose series re-pins (none: every change stays refused, above)
        (tree / reqs[0]).parent.mkdir(parents=True, exist_ok=True)
        (tree / reqs[0]).write_text(f"# pinned by the series\n{DEP}==2.0\n")
        assert _verify(built, official, tree) == []


def test_changed_pins_are_the_projects_of_touched_requirements_files(tmp_path: Path):
    req = tmp_path / "requirements"
    req.mkdir()
    (req / "cuda.txt").write_text(
        "# a comment naming not-a-pin==1\n-r common.txt\n\n"
        "Foo_Bar==1.0\nbaz[extra] >= 2 ; python_version > '3.10'\n  indented==3\n"
        "  -r indented-option.txt\n\t# an indented comment\n"
    )
    (req / "common.txt").write_text("untouched==1\n")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "requirements.txt").write_text("elsewhere==1\n")
    touched = {"requirements/cuda.txt", "requirements/gone.txt", "docker/requirements.txt"}
    assert _changed_pins(touched, tmp_path) == {"foo-bar", "baz", "indented"}
    assert _changed_pins(set(), tmp_path) == set()


def test_touched_files_are_the_files_each_patch_writes():
    """Compared with the `+++ b/PATH` lines of each patch, read here."""
    names = read_series(LINE.series)
    every = set()
    for name in names:
        text = (LINE.patches / name).read_text()
        written = set(re.findall(r"^\+\+\+ b/(\S+)", text, re.M))
        assert written and touched_files(LINE, [name]) == written, name
        every |= written
    assert touched_files(LINE) == every
    assert touched_files(LINE, []) == set()
