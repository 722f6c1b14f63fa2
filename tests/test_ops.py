# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What an operator meets: output folders on other mounts, read-only or full
file systems, a build killed with kill -9, and checking a signed dist/ with
nothing but what dist/ holds.

The mount tests need root (or CAP_SYS_ADMIN), as this machine and CI have;
where mounting is refused they are skipped, saying so.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from repo_copy import run_pipeline
from small_dist import SIDE, check_sums, keypair, publish_small, sha, sums
from wheels import make_wheel

from tpfix import package, pipeline
from tpfix.lines import get_line
from tpfix.util import ROOT, Fail


def _mount(target: Path, *args: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting is not permitted here (mount {' '.join(args)}: {proc.stderr})")


@contextlib.contextmanager
def _mounted(target: Path, *args: str):
    _mount(target, *args)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


def _tmpfs(target: Path, size: str = "64m"):
    return _mounted(target, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")


def _published(dist: Path) -> list[str]:
    return sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*"))


def _stage_and_publish(dist: Path, inputs: Path) -> Path:
    """The pipeline's staging and publish steps, on a tiny wheel."""
    pipeline.writable_folder(dist, "dist folder", "give another")
    with pipeline.staged(dist) as staging:
        wheel = make_wheel(staging, "0.27.1+tpfix.3")
        sd, off = inputs / "sdist.tar.gz", inputs / "official.whl"
        extras = package.describe(wheel, get_line(), sd, off, "x86_64", "1", None)
        return package.publish(wheel, dist, extras)


@pytest.mark.slow  # a package stage (about a second)
@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_publish_into_a_mount_point(tmp_path: Path, kind: str):
    """dist/ is a mount point (a container volume, NFS, another disk):
    rename from beside it would fail with EXDEV; staging inside it does not."""
    for name in ("sdist.tar.gz", "official.whl"):
        (tmp_path / name).write_bytes(b"stand-in")
    dist = tmp_path / "dist"
    if kind == "tmpfs":
        cm = _tmpfs(dist)
    else:
        (tmp_path / "elsewhere").mkdir()
        cm = _mounted(dist, "--bind", str(tmp_path / "elsewhere"))
    with cm:
        assert pipeline.mount_point(dist) == dist  # the bind mount too
        if kind == "tmpfs":  # another file system, not only another mount
            assert os.stat(dist).st_dev != os.stat(tmp_path).st_dev
        # the cross-device case is real: a rename from dist's parent is refused
        (tmp_path / "beside").write_text("x")
        with pytest.raises(OSError) as e:
            os.replace(tmp_path / "beside", dist / "beside")
        assert e.value.errno == errno.EXDEV
        wheel = _stage_and_publish(dist, tmp_path)
        expected = sorted(
            [wheel.name, *(wheel.name + s for s in SIDE), "SHA256SUMS"]
            + ["simple", "simple/index.html", "simple/vllm", "simple/vllm/index.html"]
        )
        assert _published(dist) == expected  # no staging folder, nothing hidden
        check_sums(dist)
        if kind == "bind":
            assert (tmp_path / "elsewhere" / wheel.name).exists()


def test_a_killed_builds_staging_is_removed_by_the_next(tmp_path: Path):
    dist = tmp_path / "dist"
    (dist / ".staging-4242-abc").mkdir(parents=True)
    (dist / ".staging-4242-abc" / "part.whl").write_bytes(b"half")
    (dist / "keep.txt").write_text("not ours to remove")
    pipeline.clear_staging(dist)
    assert sorted(p.name for p in dist.iterdir()) == ["keep.txt"]


_KILLED_AT_THE_RENAME = """
import os, signal, sys
from pathlib import Path
from tpfix import package
os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)  # kill -9 at the rename
package.write_sums(Path(sys.argv[1]), [Path(sys.argv[2])])
"""


def test_a_write_killed_at_its_rename_leaves_nothing_after_the_next_build(tmp_path: Path):
    """A kill -9 between writing SHA256SUMS's temporary file and renaming it
    (a real SIGKILL in a child): the next build's clear_staging removes the
    temporary file, in dist/ and in the folders SHA256SUMS lists."""
    dist = tmp_path / "dist"
    (dist / "image").mkdir(parents=True)
    (dist / "keep.txt").write_text("published")
    (dist / "image" / "a.json").write_text("{}")
    package.write_sums(dist, [Path("keep.txt"), Path("image/a.json")])
    sums = (dist / "SHA256SUMS").read_text()
    for folder, name in ((dist, "keep.txt"), (dist / "image", "a.json")):
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED_AT_THE_RENAME, str(folder), name],
            env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
        )
        assert proc.returncode == -signal.SIGKILL
    left = sorted(p.relative_to(dist).as_posix() for p in dist.rglob(".*partial-*"))
    assert [p.split(".partial-")[0] for p in left] == [".SHA256SUMS", "image/.SHA256SUMS"]
    pipeline.clear_staging(dist)
    assert not list(dist.rglob(".*partial-*"))
    assert (dist / "SHA256SUMS").read_text() == sums  # the published files stay
    assert sorted(p.name for p in dist.rglob("*")) == ["SHA256SUMS", "a.json", "image", "keep.txt"]


# A build from another checkout (or an older tpfix): its lock file is not in
# this checkout's build/dists, but it holds the dist folder itself.
_OTHER_CHECKOUT = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
os.mkdir(os.path.join(sys.argv[1], ".staging-1-other"))
print("locked", flush=True)
time.sleep(300)
"""


def test_a_build_from_another_checkout_into_the_same_dist_is_refused(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    dist = tmp_path / "dist"
    dist.mkdir()
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_CHECKOUT, str(dist)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout.readline() == "locked\n"
        proc = run_pipeline(repo, dist, tmp_path / "w")
        assert proc.returncode == 2, proc.stderr
        assert f"error: dist folder {dist} is in use by another build" in proc.stderr
        assert "./build.sh --dist DIR" in proc.stderr and "Traceback" not in proc.stderr
        assert (dist / ".staging-1-other").is_dir()  # its staging folder is left alone
    finally:
        other.kill()
        other.wait()


def _only_error_line(err: str) -> str:
    assert "Traceback" not in err and "==> fetch" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith("error: "), err
    return line


def test_read_only_dist_or_parent_is_refused_before_any_download(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    ro = tmp_path / "ro"
    (tmp_path / "src" / "dist").mkdir(parents=True)
    with _mounted(ro, "--bind", str(tmp_path / "src")):
        _mount(ro, "-o", "remount,ro,bind")
        with pytest.raises(OSError):
            (ro / "probe").write_text("a read-only mount")
        for dist, cause in ((ro / "dist", ""), (ro / "new" / "dist", f": {ro / 'new'}")):
            proc = run_pipeline(
                repo,
                dist,
                tmp_path / "work",
                env={"PIP_NO_INDEX": "1"},
                cache=tmp_path / "cache",
            )
            assert proc.returncode == 2, proc.stderr
            line = _only_error_line(proc.stderr)
            assert f"dist folder {dist} is not writable (Read-only file system{cause});" in line
            assert "./build.sh --dist DIR" in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.whl"))


def test_too_little_space_is_refused_before_any_download(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    with _tmpfs(tmp_path / "small", "8m") as small:
        dist = small / "dist"
        proc = run_pipeline(
            repo,
            dist,
            tmp_path / "work",
            env={"PIP_NO_INDEX": "1"},
            cache=tmp_path / "cache",
        )
        assert proc.returncode == 2, proc.stderr
        line = _only_error_line(proc.stderr)
        assert "not enough free space" in line
        need = f"{pipeline.DIST_SPACE / 10**9:.2f} GB"
        assert f"dist folder {dist}: a build needs {need} on the file system at {small}" in line
        assert "0.01 GB free" in line
        assert f"{pipeline.SPACE_CHECK_ENV}=0" in line
        assert str(tmp_path / "work") not in line  # that one has room
        assert not dist.exists()  # a failed pre-check leaves no folder it created
        # the operator's override: past the check, to the first download
        proc = run_pipeline(
            repo,
            dist,
            tmp_path / "work",
            env={"PIP_NO_INDEX": "1", pipeline.SPACE_CHECK_ENV: "0"},
            cache=tmp_path / "cache",
        )
        assert proc.returncode == 2, proc.stderr
        assert "not enough free space" not in proc.stderr
        assert f"vllm=={get_line().tag[1:]} is not available" in proc.stderr  # the default line
        # its staging folder is gone again, and so is the dist folder it created
        assert not dist.exists()
        assert not any((repo / "build" / "dists").glob("dist-*"))


def _fill(path: Path) -> None:
    with open(path, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
            f.flush()


@pytest.mark.slow  # a package stage (about a second)
def test_a_full_disk_mid_publish_is_one_error_naming_the_file_system(tmp_path: Path):
    for name in ("sdist.tar.gz", "official.whl"):
        (tmp_path / name).write_bytes(b"stand-in")
    work = tmp_path / "work"
    work.mkdir()
    with _tmpfs(tmp_path / "dist", "4m") as dist:
        with (
            pytest.raises(Fail) as e,
            pipeline.space_errors(work, dist),
            pipeline.staged(dist) as staging,
        ):
            wheel = make_wheel(staging, "0.27.1+tpfix.3")
            sd, off = tmp_path / "sdist.tar.gz", tmp_path / "official.whl"
            extras = package.describe(wheel, get_line(), sd, off, "x86_64", "1", None)
            _fill(dist / "filler")  # the disk fills up meanwhile
            package.publish(wheel, dist, extras)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith("no space left on device")
        assert f"dist folder {dist}: a build needs" in msg and f"file system at {dist}" in msg
        assert f"work folder {work}: a build needs" in msg
        assert not list(dist.glob(".staging-*"))


def test_a_full_dist_during_setup_py_names_the_dist_file_system(tmp_path: Path, monkeypatch):
    """setup.py (a stand-in: it fills the output folder, inside dist's staging,
    and says only "No space left on device", as setuptools may) on a full
    dist file system: the error names a file on dist's file system, not the
    work tree, while the tree's file system has room."""
    from tpfix import build

    tree, work = tmp_path / "work" / "tree.x", tmp_path / "work"
    tree.mkdir(parents=True)

    def setup_py(cmd, **kwargs):
        # cmd: python -c _SETUP plat OUT cuda; unbuffered: nothing left to flush
        part = Path(cmd[4]) / "vllm.whl.part"
        with open(part, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        return subprocess.CompletedProcess(cmd, 1, "", "error: [Errno 28] No space left on device")

    monkeypatch.setattr(build, "run", setup_py)
    with _tmpfs(tmp_path / "dist", "4m") as dist:
        with (
            pytest.raises(Fail) as e,
            pipeline.space_errors(work, dist),
            pipeline.staged(dist) as staging,
        ):
            official = tmp_path / "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"
            build.build_wheel(
                tree, "0.27.1+tpfix.3", official, "x86_64", staging, 1, work / "log", "12.9"
            )
        msg = str(e.value)
        assert msg.startswith(f"no space left on device writing {dist}/"), msg
        assert str(tree) not in msg


@pytest.mark.slow  # downloads (the pinned sdist and wheel), patches and starts setup.py
def test_a_full_work_disk_mid_build_is_one_error_line(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    """Past the up-front check (skipped), the tree and setup.py's output fill
    a small work file system: one `error:` line, no setuptools text."""
    with _tmpfs(tmp_path / "small", "200m") as small:
        work = small / "work"
        proc = run_pipeline(
            repo,
            tmp_path / "dist",
            work,
            "--no-cache",  # a real tree and setup.py, not the cached wheel
            env={pipeline.SPACE_CHECK_ENV: "0"},
        )
        assert proc.returncode == 2, proc.stderr
        assert "==> patch" in proc.stderr  # it got as far as writing the tree
        errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith(("==> ", "fetch: "))]
        assert len(errors) == 1 and errors[0].startswith("error: no space left on device"), errors
        need = f"{pipeline.WORK_SPACE / 10**9:.2f} GB"
        assert (
            f"work folder {work}: a build needs {need} on the file system at {small}" in (errors[0])
        )
        assert not list(work.glob("tree.*"))
        assert not (tmp_path / "dist").exists()  # the empty dist it created is gone too


@pytest.mark.slow  # downloads the pinned sdist (pip)
def test_a_full_download_cache_is_one_error_line_naming_it(repo: Path, tmp_path: Path):  # noqa: F811 (the fixture)
    with _tmpfs(tmp_path / "cache", "20m") as cache:  # the sdist alone is 39 MB
        proc = run_pipeline(
            repo,
            tmp_path / "dist",
            tmp_path / "work",
            cache=cache,
        )
        assert proc.returncode == 2, proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith(("==> ", "fetch: "))]
        assert len(errors) == 1 and errors[0].startswith("error: no space left on device"), errors
        assert f"(its file system at {cache}: " in errors[0]
        assert "set VLLM_DIST_CACHE to a download cache on another file system" in errors[0]
        assert not list((cache / "sha256").glob("*/*"))


# A stand-in for upstream's setup.py: says it runs, then keeps running.
_SETUP_PY = """
import os, time
open("child.pid", "w").write(str(os.getpid()))
time.sleep(120)
"""

_BUILD_STAGE = """
import sys
from pathlib import Path
from tpfix.build import build_wheel
tree, out = Path(sys.argv[1]), Path(sys.argv[2])
official = out / "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"
build_wheel(tree, "0.27.1+tpfix.3", official, "x86_64", out, "1", out / "log", "12.9")
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped


def test_kill_9_of_a_build_leaves_no_setup_py_behind(tmp_path: Path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    tree.mkdir()
    out.mkdir()
    (tree / "setup.py").write_text(_SETUP_PY)
    stage = subprocess.Popen([sys.executable, "-c", _BUILD_STAGE, str(tree), str(out)])
    pid_file = tree / "child.pid"
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()):
        assert stage.poll() is None and time.monotonic() < deadline, "setup.py never started"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _alive(child)
    try:
        stage.send_signal(signal.SIGKILL)
        stage.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"setup.py (pid {child}) outlived the killed build"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


# --- checking dist/ with dist/ alone ----------------------------------------------


@pytest.mark.slow  # a subprocess for the release artifacts
def test_attest_verify_without_artifact_is_refused(tmp_path: Path):
    priv, pub = keypair(tmp_path)
    from tpfix import attest

    stmt = tmp_path / "x.provenance.json"
    subject = [{"name": "x.whl", "digest": {"sha256": "0" * 64}}]
    doc = {"_type": attest.STATEMENT_TYPE, "predicateType": attest.PREDICATE_TYPE}
    stmt.write_text(json.dumps({**doc, "subject": subject, "predicate": {"buildDefinition": {}}}))
    env = tmp_path / "x.intoto.jsonl"
    env.write_text(attest.sign(stmt.read_bytes(), attest.load_signer(priv)))
    cmd = [sys.executable, "-m", "tpfix.attest", "verify", str(env), "--key", str(pub)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "signature OK" not in proc.stdout
    assert "give --artifact FILE" in proc.stderr and "--signature-only" in proc.stderr
    proc = subprocess.run([*cmd, "--signature-only"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "signature OK (signature only: no artifact checked)" in proc.stdout
    # a missing or unreadable --artifact: one line naming it, no traceback
    for bad in (tmp_path / "nope.whl", tmp_path):
        proc = subprocess.run([*cmd, "--artifact", str(bad)], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "signature OK" not in proc.stdout
        assert f"--artifact {bad}: cannot read it" in proc.stderr, proc.stderr


def _clean_python(tmp_path: Path) -> Path:
    """A fresh venv that sees `cryptography` (from this one's site-packages,
    added as a plain path: no .pth of it runs, so no editable tpfix) and
    nothing of this repository."""
    env = tmp_path / "clean-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = env / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [py, "-I", "-c", "import cryptography, importlib.util as u; print(u.find_spec('tpfix'))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
    return py


@pytest.mark.slow  # a package stage (about a second) and a venv
def test_dist_verify_py_checks_a_signed_dist_without_this_repository(tmp_path: Path):
    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    verify_py = dist / "verify.py"
    assert "verify.py" in (dist / "SHA256SUMS").read_text()
    env = dist / f"{wheel.name}.intoto.jsonl"
    got = tmp_path / "received"  # what someone gets: dist/ alone
    shutil.copytree(dist, got)
    py = _clean_python(tmp_path)

    def check(envelope: Path, artifact: Path, key: Path = pub):
        return subprocess.run(
            [py, "-I", str(got / "verify.py"), str(envelope), "--key", str(key)]
            + ["--artifact", str(artifact)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    genv, gwheel = got / env.name, got / wheel.name
    proc = check(genv, gwheel)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"OK: {gwheel} is the signed subject of {genv}")
    # a changed wheel
    tampered = tmp_path / wheel.name
    data = bytearray(gwheel.read_bytes())
    data[len(data) // 2] ^= 1
    tampered.write_bytes(bytes(data))
    proc = check(genv, tampered)
    assert proc.returncode == 2 and "is not the subject of" in proc.stderr, proc.stderr
    # a changed statement inside the envelope (the signature no longer covers it)
    doc = json.loads(genv.read_text())
    stmt = json.loads(base64.b64decode(doc["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = "0" * 64
    doc["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    forged = tmp_path / "forged.intoto.jsonl"
    forged.write_text(json.dumps(doc))
    proc = check(forged, gwheel)
    assert proc.returncode == 2 and "no signature verifies" in proc.stderr, proc.stderr
    # another key
    (tmp_path / "other").mkdir()
    _, other = keypair(tmp_path / "other")
    proc = check(genv, gwheel, other)
    assert proc.returncode == 2 and "no signature verifies" in proc.stderr, proc.stderr
    assert verify_py.read_bytes() == (
        Path(pipeline.__file__).with_name("dist_verify.py").read_bytes()
    )


@pytest.mark.slow  # a package stage (about a second)
def test_both_verifiers_agree_on_every_input(tmp_path: Path):
    """verify.py (what dist/ ships) and tpfix.attest verify give the same
    verdict and exit status on each input: 0 for the signed wheel, also with
    a changed keyid (an unauthenticated hint in DSSE: a keyid names no key),
    2 for a changed wheel, a forged statement, another key, a missing file."""
    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    env = dist / f"{wheel.name}.intoto.jsonl"
    doc = json.loads(env.read_text())
    inputs = {"signed": (env, wheel, pub, 0)}
    rekeyed = json.loads(json.dumps(doc))
    rekeyed["signatures"][0]["keyid"] = "0" * 64
    (tmp_path / "rekeyed.intoto.jsonl").write_text(json.dumps(rekeyed))
    inputs["changed keyid"] = (tmp_path / "rekeyed.intoto.jsonl", wheel, pub, 0)
    tampered = tmp_path / wheel.name
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1
    tampered.write_bytes(bytes(data))
    inputs["changed wheel"] = (env, tampered, pub, 2)
    forged = json.loads(json.dumps(doc))
    stmt = json.loads(base64.b64decode(forged["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = _sha256(tampered)
    forged["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    (tmp_path / "forged.intoto.jsonl").write_text(json.dumps(forged))
    inputs["forged statement"] = (tmp_path / "forged.intoto.jsonl", tampered, pub, 2)
    (tmp_path / "other").mkdir()
    _, other = keypair(tmp_path / "other")
    inputs["another key"] = (env, wheel, other, 2)
    inputs["missing wheel"] = (env, tmp_path / "nope.whl", pub, 2)
    verify_py = [sys.executable, "-I", str(dist / "verify.py")]
    attest_verify = [sys.executable, "-m", "tpfix.attest", "verify"]
    for what, (envelope, artifact, key, status) in inputs.items():
        args = [str(envelope), "--key", str(key), "--artifact", str(artifact)]
        for tool in (verify_py, attest_verify):
            proc = subprocess.run([*tool, *args], capture_output=True, text=True)
            assert proc.returncode == status, (what, tool, proc.stdout, proc.stderr)
            assert "Traceback" not in proc.stderr, (what, tool, proc.stderr)


@pytest.mark.slow  # package stages (about a second each)
def test_a_signed_dist_is_signed_as_a_whole(tmp_path: Path):
    """With a key, SHA256SUMS.intoto.jsonl signs SHA256SUMS and every file it
    lists; verify.py --dist and attest verify-dist check every file and
    agree: the release engineer's probe (an SBOM edited and its SHA256SUMS
    line rewritten) and a changed file fail both; adding files needs the
    key; an unsigned build into the folder drops the old signature."""
    from tpfix import attest

    priv, pub = keypair(tmp_path)
    dist, wheel, _, _ = publish_small(tmp_path, key=priv)
    envelope = dist / attest.SUMS_ENVELOPE
    listed = sums(dist)
    assert attest.SUMS_ENVELOPE not in listed  # the one file it cannot list
    stmt = json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"]))
    assert stmt["predicateType"] == "https://in-toto.io/attestation/release/v0.1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    assert subjects == {"SHA256SUMS": sha(dist / "SHA256SUMS"), **listed}
    assert {wheel.name, f"{wheel.name}.cdx.json", "simple/vllm/index.html"} <= set(subjects)
    tools = {
        "verify.py": [sys.executable, "-I", str(dist / "verify.py"), "--dist", str(dist)],
        "attest": [sys.executable, "-m", "tpfix.attest", "verify-dist", str(dist)],
    }

    def verdicts() -> dict[str, tuple[int, str]]:
        out = {}
        for name, cmd in tools.items():
            proc = subprocess.run([*cmd, "--key", str(pub)], capture_output=True, text=True)
            assert "Traceback" not in proc.stderr, proc.stderr
            out[name] = (proc.returncode, proc.stdout + proc.stderr)
        return out

    assert {k: v[0] for k, v in verdicts().items()} == {"verify.py": 0, "attest": 0}
    # the probe: drop a component from the SBOM, rewrite its SHA256SUMS line
    bom = dist / f"{wheel.name}.cdx.json"
    original, sums_before = bom.read_bytes(), (dist / "SHA256SUMS").read_bytes()
    doc = json.loads(original)
    doc["components"] = doc["components"][1:]
    bom.write_text(json.dumps(doc))
    (dist / "SHA256SUMS").write_text(sums_before.decode().replace(listed[bom.name], sha(bom)))
    for name, (code, text) in verdicts().items():
        assert code == 2 and "SHA256SUMS is not the one" in text, (name, text)
    (dist / "SHA256SUMS").write_bytes(sums_before)  # a changed file, SHA256SUMS as signed
    for name, (code, text) in verdicts().items():
        assert code == 2 and f"{bom} (sha256 {sha(bom)}) is not the file" in text, (name, text)
    bom.write_bytes(original)
    # adding files (the image's, an audit's) needs the key: without it nothing changes
    with pytest.raises(Fail, match=r"SHA256SUMS.intoto.jsonl signs this dist folder: give"):
        package.add_to_dist(dist, {Path("image/x.cdx.json"): "{}"})
    assert not (dist / "image").exists() and (dist / "SHA256SUMS").read_bytes() == sums_before
    package.add_to_dist(dist, {Path("image/x.cdx.json"): "{}"}, signer=attest.load_signer(priv))
    assert {k: v[0] for k, v in verdicts().items()} == {"verify.py": 0, "attest": 0}
    # an unsigned build into the folder: the old signature would not verify, it goes
    publish_small(tmp_path, version="0.27.1+tpfix.4")
    assert not envelope.exists()


@pytest.mark.slow  # a package stage (about a second)
def test_an_unsigned_dist_ships_no_verify_py(tmp_path: Path):
    dist, _, _, _ = publish_small(tmp_path)
    assert not (dist / "verify.py").exists()


@pytest.mark.slow  # a subprocess for the release artifacts
@pytest.mark.parametrize("kind", ["ecdsa-p256", "ecdsa-p384", "rsa"])
def test_verify_py_takes_every_key_type_attest_signs_with(tmp_path: Path, kind: str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    from tpfix import attest

    key = {
        "ecdsa-p256": lambda: ec.generate_private_key(ec.SECP256R1()),
        "ecdsa-p384": lambda: ec.generate_private_key(ec.SECP384R1()),
        "rsa": lambda: rsa.generate_private_key(65537, 3072),
    }[kind]()
    priv, pub = tmp_path / "key.pem", tmp_path / "key.pub.pem"
    priv.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    wheel = tmp_path / "x.whl"
    wheel.write_bytes(b"a wheel")
    subject = [{"name": wheel.name, "digest": {"sha256": _sha256(wheel)}}]
    doc = {"_type": attest.STATEMENT_TYPE, "predicateType": attest.PREDICATE_TYPE}
    payload = json.dumps({**doc, "subject": subject, "predicate": {}}).encode()
    env = tmp_path / "x.intoto.jsonl"
    env.write_text(attest.sign(payload, attest.load_signer(priv)))
    script = Path(pipeline.__file__).with_name("dist_verify.py")
    cmd = [sys.executable, "-I", str(script), str(env), "--key", str(pub), "--artifact"]
    proc = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "y.whl").write_bytes(b"another wheel")
    proc = subprocess.run([*cmd, str(tmp_path / "y.whl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "is not the subject of" in proc.stderr, proc.stderr


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
