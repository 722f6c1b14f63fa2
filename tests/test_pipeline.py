# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The pipeline's own steps (scripts/tpfix/pipeline.py), unit by unit, in
tmp_path: the step lines, the staging folder, the clean-up of what killed
builds left, the output folder checks, the space checks and the messages of
a full disk, the tool check, and main()'s arguments.

Simulated: a full file system (pipeline.free_bytes answering 0; an OSError
ENOSPC raised inside the block, as a write or pip's failure would end),
missing tools (made-up module names in pipeline.TOOLS), and the build itself
(main()'s locks, tool check and _run_locked replaced by recorders, to see
what its arguments become).

Already tested elsewhere, not here (test_ops.py, test_package.py,
test_bad_input.py): clear_staging of a staging folder and of a write killed at
its rename; staged and publish on a mount point; a read-only dist or parent;
too little space and TPFIX_SPACE_CHECK=0 on a real small tmpfs; a full disk
mid-publish and during setup.py; the build locks; one missing tool; an
unknown --line.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest

from tpfix import pipeline
from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line, line_names
from tpfix.core.util import PARTIAL, ROOT, Fail
from tpfix.release import attest
from tpfix.stages import package


def test_a_step_is_one_line_on_stderr(capsys):
    pipeline._step("fetch + verify pins")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "==> fetch + verify pins\n")


def test_staged_is_a_folder_in_the_work_folder_removed_however_the_block_ends(tmp_path: Path):
    """Staging happens outside dist/, in the work folder: a server publishing
    dist/ never serves it; a killed build's is removed by the next."""
    work = tmp_path / "work"
    work.mkdir()
    with pipeline.staged(work) as staging:
        assert staging.parent == work and staging.is_dir()
        assert staging.name.startswith(f"staging-{os.getpid()}-")
        (staging / "vllm.whl").write_bytes(b"a wheel being made")
        with pipeline.staged(work) as second:
            assert second != staging
    assert list(work.iterdir()) == []
    with pytest.raises(RuntimeError, match="the build failed"), pipeline.staged(work) as staging:
        (staging / "half.whl").write_bytes(b"half")
        raise RuntimeError("the build failed")
    assert list(work.iterdir()) == []
    (work / "staging-4242-abc").mkdir()  # a killed build's
    (work / "keep").mkdir()
    pipeline._prepare_folders(work, tmp_path / "dist")
    assert sorted(p.name for p in work.iterdir()) == ["keep"]


def test_a_work_folder_inside_the_dist_folder_is_refused(tmp_path: Path):
    dist = tmp_path / "dist"
    with pytest.raises(Fail, match=r"work folder .* is inside dist folder .*: a server publishing"):
        pipeline._prepare_folders(dist / "work", dist)


def test_clear_staging_removes_old_indexes_and_legacy_staging_only(tmp_path: Path):
    """A publish killed between its two renames leaves dist/.<folder>.old;
    builds before dist/.staging-* staged beside dist, in .<dist>-staging.*."""
    dist = tmp_path / "dist"
    (dist / ".simple.old" / "vllm").mkdir(parents=True)
    (dist / "simple" / "vllm").mkdir(parents=True)
    (dist / ".hidden-but-ours-not").write_text("not a build's")
    legacy = tmp_path / ".dist-staging.1234"
    (legacy / "part").mkdir(parents=True)
    (tmp_path / ".other-staging.1234").mkdir()  # another folder's: not dist's
    package.clear_staging(dist)
    assert sorted(p.name for p in dist.iterdir()) == [".hidden-but-ours-not", "simple"]
    assert (dist / "simple" / "vllm").is_dir()
    assert not legacy.exists()
    assert (tmp_path / ".other-staging.1234").is_dir()


def test_clear_staging_with_an_unreadable_sha256sums_still_clears_dist(tmp_path: Path):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "SHA256SUMS").write_text("not a sha256sum line\n")
    (dist / f".SHA256SUMS{PARTIAL}abc").write_text("a killed write")
    (dist / ".staging-1-x").mkdir()
    package.clear_staging(dist)
    assert sorted(p.name for p in dist.iterdir()) == ["SHA256SUMS"]
    assert (dist / "SHA256SUMS").read_text() == "not a sha256sum line\n"  # the build rewrites it


def test_writable_folder_makes_missing_parents(tmp_path: Path):
    folder = tmp_path / "a" / "b" / "dist"
    pipeline.writable_folder(folder, "dist folder", "give another")
    assert folder.is_dir() and list(folder.iterdir()) == []  # its probe file is gone


@pytest.mark.parametrize("where", ["folder", "parent", "grandparent"])
def test_a_file_in_the_folders_place_is_one_line_naming_it(tmp_path: Path, where: str):
    blocker = tmp_path / "dist"
    blocker.write_text("a file, not a folder")
    folder = {"folder": blocker, "parent": blocker / "sub", "grandparent": blocker / "a" / "b"}
    with pytest.raises(Fail) as e:
        pipeline.writable_folder(
            folder[where], "dist folder", "give another: ./build.sh --dist DIR"
        )
    assert str(e.value) == (
        f"dist folder {folder[where]} cannot be made: {blocker} is a file, not a folder; "
        "move that file away, or give another: ./build.sh --dist DIR"
    )
    assert blocker.read_text() == "a file, not a folder"


def test_every_missing_tool_is_named_at_once(monkeypatch):
    monkeypatch.setitem(pipeline.TOOLS, "tpfix_no_such_a", ("tool-a", "the first"))
    monkeypatch.setitem(pipeline.TOOLS, "tpfix_no_such_b", ("tool-b", "the second"))
    with pytest.raises(Fail) as e:
        pipeline.check_tools()
    assert f"missing in {sys.prefix}: tool-a (the first), tool-b (the second);" in str(e.value)


def test_work_and_dist_on_one_file_system_need_the_sum(tmp_path: Path, monkeypatch):
    work, dist = tmp_path / "work", tmp_path / "dist"
    work.mkdir()
    dist.mkdir()
    ((mp, free, need, what),) = pipeline.space_needs(work, dist)
    assert need == pipeline.WORK_SPACE + pipeline.DIST_SPACE
    assert what == f"work folder {work} and dist folder {dist}"
    assert mp == pipeline.mount_point(tmp_path) and (mp == Path("/") or mp.is_mount())
    monkeypatch.setattr(pipeline, "free_bytes", lambda folder: need - 1)  # one byte short
    with pytest.raises(Fail) as e:
        pipeline.check_space(work, dist)
    msg = str(e.value)
    assert msg.startswith("not enough free space: work folder ")
    assert f"a build needs {need / 10**9:.2f} GB on the file system at {mp}" in msg
    monkeypatch.setenv(pipeline.SPACE_CHECK_ENV, "0")
    pipeline.check_space(work, dist)  # the operator's override
    monkeypatch.setenv(pipeline.SPACE_CHECK_ENV, "1")
    monkeypatch.setattr(pipeline, "free_bytes", lambda folder: need)
    pipeline.check_space(work, dist)  # exactly enough


def test_a_full_disk_in_the_block_is_one_line_with_the_fix(tmp_path: Path):
    work, dist = tmp_path / "work", tmp_path / "dist"
    work.mkdir()
    dist.mkdir()
    target = work / "tree.x" / "vllm" / "big.so"  # not made yet: its parents are searched
    for code in (errno.ENOSPC, errno.EDQUOT):
        with pytest.raises(Fail) as e, pipeline.space_errors(work, dist):
            raise OSError(code, "No space left on device", str(target))
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith(f"no space left on device writing {target}: work folder {work}")
        assert msg.endswith("free some, or use --workdir/--dist on another file system")


def test_a_full_disk_elsewhere_names_that_file_system_and_the_cache(tmp_path: Path):
    """A file on neither work's nor dist's file system (the download cache's):
    /proc stands in for it (another mount on every Linux)."""
    work, dist = tmp_path / "work", tmp_path / "dist"
    work.mkdir()
    dist.mkdir()
    if pipeline.mount_point(Path("/proc")) == pipeline.mount_point(tmp_path):
        pytest.skip("/proc is not a mount point here")
    with pytest.raises(Fail) as e, pipeline.space_errors(work, dist):
        raise OSError(errno.ENOSPC, "No space left on device", "/proc/tpfix-cache/tmp/x")
    msg = str(e.value)
    assert "writing /proc/tpfix-cache/tmp/x (its file system at /proc: " in msg
    assert msg.endswith("set VLLM_DIST_CACHE to a download cache on another file system")


def test_other_errors_pass_through_the_space_check(tmp_path: Path):
    with pytest.raises(PermissionError) as e, pipeline.space_errors(tmp_path, tmp_path):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x"))
    assert e.value.errno == errno.EACCES


@pytest.fixture
def build_args(monkeypatch, capsys):
    """main(ARGS) -> what it would build: the locks' folders and _run_locked's
    arguments; nothing is locked, fetched or built."""
    seen: dict = {}

    class Locks:
        def __init__(self, workdir, dist):
            seen["locks"] = (workdir, dist)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def run_locked(ctx, arch, dist, workdir, signer=None, cached=True):
        seen["run"] = {"arch": arch, "dist": dist, "workdir": workdir, "line": ctx.line}
        seen["run"]["cached"] = cached
        seen.setdefault("builds", []).append((ctx, arch))
        return type("Release", (), {"wheel": dist / "vllm.whl"})()

    def resolve(line):
        seen.setdefault("resolved", []).append(line)
        return resolve_for_real(line)

    resolve_for_real = BuildContext.resolve
    monkeypatch.setattr(pipeline, "build_locks", Locks)
    monkeypatch.setattr(pipeline, "_prepare_folders", lambda workdir, dist: dist)
    monkeypatch.setattr(pipeline.BuildContext, "resolve", staticmethod(resolve))
    monkeypatch.setattr(pipeline, "_run_locked", run_locked)
    monkeypatch.setattr(pipeline, "check_tools", lambda: None)
    monkeypatch.setattr(pipeline, "sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr(attest, "signing_key", lambda path: None)

    def main(*args: str) -> dict:
        seen.clear()
        monkeypatch.setattr(sys, "argv", ["tpfix.pipeline", *args])
        pipeline.main()
        wheels = f"{seen['run']['dist'] / 'vllm.whl'}\n" * len(seen["builds"])
        assert capsys.readouterr().out == wheels
        return seen

    return main


def test_main_builds_the_default_line_into_dist_by_default(build_args):
    seen = build_args()
    run = seen["run"]
    assert run["line"] == get_line()
    assert (run["dist"], run["workdir"]) == (ROOT / "dist", ROOT / "build" / "work")
    assert seen["locks"] == (run["workdir"], run["dist"])
    assert run["cached"] is True


def test_main_builds_another_line_into_its_own_folders(build_args, tmp_path: Path):
    others = [n for n in line_names() if n != get_line().tag]
    if not others:
        pytest.skip("one release line only")
    tag = others[0]
    run = build_args("--line", tag, "--no-cache")["run"]
    assert run["line"] == get_line(tag)
    assert run["dist"] == ROOT / "dist" / tag
    assert run["workdir"] == ROOT / "build" / f"work-{tag}"
    assert run["cached"] is False
    given = build_args("--line", tag, "--dist", str(tmp_path / "d"), "--workdir", str(tmp_path))
    assert (given["run"]["dist"], given["run"]["workdir"]) == (tmp_path / "d", tmp_path)
    assert given["locks"] == (tmp_path, tmp_path / "d")


def test_one_context_for_every_arch_of_the_build(build_args):
    """--arch all: the line's VERSION, series and pins are resolved once, the
    arches are the ones its pins list, and each arch's build gets that one
    context."""
    seen = build_args("--arch", "all")
    (line,) = seen["resolved"]
    ctx = seen["builds"][0][0]
    assert [a for _, a in seen["builds"]] == ctx.arches
    assert ctx.arches == sorted({a.arch for a in ctx.pins if a.role == "wheel"})
    assert len(ctx.arches) > 1
    assert all(c is ctx for c, _ in seen["builds"])
    assert ctx == BuildContext.resolve(line)  # what the line's files say now
    assert seen["run"]["cached"] is True


def test_an_arch_the_line_does_not_pin_stops_before_any_work(build_args, monkeypatch):
    ctx = BuildContext.resolve(get_line())
    monkeypatch.setattr(
        pipeline.BuildContext,
        "resolve",
        staticmethod(lambda line: ctx.but(pins=tuple(a for a in ctx.pins if a.arch != "aarch64"))),
    )
    with pytest.raises(Fail, match="no official wheel pinned for arch 'aarch64'"):
        build_args("--arch", "aarch64")


@pytest.mark.parametrize("bad", [["--line", "v9.9.9"], ["--arch", "sparc"], ["--no-such"]])
def test_a_bad_option_is_one_line_naming_build_sh(bad: list[str], monkeypatch, capsys):
    """What the operator typed was ./build.sh: the error names it, in one line
    (main_wrapper prints it as `error: ...`, exit 2), not pipeline.py's usage."""
    monkeypatch.setattr(sys, "argv", ["pipeline.py", *bad])
    with pytest.raises(Fail) as e:
        pipeline.main()
    msg = str(e.value)
    assert msg.startswith("./build.sh: ") and msg.endswith("; see ./build.sh --help"), msg
    assert "\n" not in msg and "pipeline.py" not in msg
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys, "argv", ["pipeline.py", "--help"])
    with pytest.raises(SystemExit):
        pipeline.main()
    assert capsys.readouterr().out.startswith("usage: ./build.sh ")
