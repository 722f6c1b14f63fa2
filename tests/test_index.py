# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The static PEP 503 index of a dist folder (scripts/tpfix/release/index.py).

Fast: a tiny wheel made here (project vllm, a local version), its index pages
and .metadata file, byte-identical on a second run.  Slow: pip resolving it
from the dist folder served by http.server on 127.0.0.1, with pip cut off
from this machine's configuration (no config file, no PIP_* variables, no
cache), so our index is all it can see; and the same for the wheel
./build.sh builds.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from served import Served
from wheels import VERSION, make_wheel

from tpfix.core.lines import get_line
from tpfix.core.util import Fail
from tpfix.core.wheelfile import wheel_metadata
from tpfix.release.index import write_index


class _Anchors(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.anchors: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.anchors.append(dict(attrs))


def anchors(page: Path) -> list[dict[str, str]]:
    parser = _Anchors()
    parser.feed(page.read_text())
    return parser.anchors


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def check_index(dist: Path, wheel: Path) -> None:
    """The pages and the .metadata file of `wheel` in `dist` are right."""
    meta = dist / f"{wheel.name}.metadata"
    assert meta.read_bytes() == wheel_metadata(wheel)
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        assert meta.read_bytes() == z.read(name)
    assert [a["href"] for a in anchors(dist / "simple" / "index.html")] == ["./vllm/"]
    (link,) = [a for a in anchors(dist / "simple" / "vllm" / "index.html")]
    assert link["href"] == f"../../{wheel.name}#sha256={_sha(wheel)}"
    assert link["data-core-metadata"] == f"sha256={_sha(meta)}"
    assert link["data-dist-info-metadata"] == f"sha256={_sha(meta)}"
    requires = [
        ln.split(":", 1)[1].strip()
        for ln in meta.read_text().splitlines()
        if ln.startswith("Requires-Python:")
    ]
    assert [link["data-requires-python"]] == requires  # unescaped by the parser


WRITTEN = ["{wheel}.metadata", "simple/index.html", "simple/vllm/index.html"]


def test_index_pages_hashes_and_metadata(tmp_path):
    dist = tmp_path / "dist"
    wheel = make_wheel(dist)
    (dist / "SHA256SUMS").write_text(f"{_sha(wheel)}  {wheel.name}\n")
    written = write_index(dist, [wheel])
    assert [p.as_posix() for p in written] == [w.format(wheel=wheel.name) for w in WRITTEN]
    check_index(dist, wheel)
    # nothing else was left: the wheel, SHA256SUMS and what it returned
    assert sorted(_tree(dist)) == sorted(
        [wheel.name, "SHA256SUMS", *(p.as_posix() for p in written)]
    )


def test_same_wheel_same_bytes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    wheel = make_wheel(one)
    write_index(one, [wheel])
    first = _tree(one)
    # another folder, another time stamp, the wheel listed twice: same bytes
    two.mkdir()
    shutil.copyfile(wheel, two / wheel.name)
    os.utime(two / wheel.name, (1_000_000_000, 1_000_000_000))
    write_index(two, [two / wheel.name, two / wheel.name])
    assert _tree(two) == first
    # again in place: same bytes, no temporary file left
    write_index(one, [wheel])
    assert _tree(one) == first


def test_a_new_wheel_replaces_the_old_ones_metadata(tmp_path):
    dist = tmp_path / "dist"
    old = make_wheel(dist, "0.0.1+tpfix.1")
    write_index(dist, [old])
    new = make_wheel(dist, "0.0.1+tpfix.2")
    old.unlink()  # as package.publish removes an older wheel
    write_index(dist, [new])
    assert sorted(_tree(dist)) == sorted([new.name, *(w.format(wheel=new.name) for w in WRITTEN)])
    check_index(dist, new)


def test_two_wheels_one_project_page(tmp_path):
    dist = tmp_path / "dist"
    a = make_wheel(dist, "0.0.1+tpfix.1")
    b = make_wheel(dist, "0.0.2+tpfix.1")
    write_index(dist, [b, a])
    hrefs = [x["href"].split("#")[0] for x in anchors(dist / "simple" / "vllm" / "index.html")]
    assert sorted(hrefs) == [f"../../{a.name}", f"../../{b.name}"]


def test_a_wheel_outside_dist_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / "elsewhere")
    (tmp_path / "dist").mkdir()
    with pytest.raises(Fail, match="not in"):
        write_index(tmp_path / "dist", [wheel])
    with pytest.raises(Fail, match="no wheels"):
        write_index(tmp_path / "dist", [])
    assert list((tmp_path / "dist").iterdir()) == []


def test_cli_indexes_the_wheels_of_dist(tmp_path):
    dist = tmp_path / "dist"
    wheel = make_wheel(dist)
    # another line's wheels in dist/<tag>/ are not this folder's
    make_wheel(dist / "v0.0.2", "0.0.2+tpfix.1")
    proc = subprocess.run(
        [sys.executable, "-m", "tpfix.release.index", str(dist)], text=True, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(dist / w.format(wheel=wheel.name)) for w in WRITTEN]
    check_index(dist, wheel)


def pip_dry_run(dist: Path, requirement: str, tmp: Path) -> tuple[dict, list, str, str]:
    """`pip install --dry-run` of `requirement` from `dist`'s index only: the
    report, the requests the server answered, and pip's output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHONNOUSERSITE="1")
    report = tmp / "report.json"
    with Served(dist) as server:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--isolated",  # no user config, no PIP_* variables
                "--disable-pip-version-check",
                "--no-cache-dir",
                "--no-input",
                "install",
                "--dry-run",
                "--no-deps",
                "--ignore-installed",
                "--index-url",
                f"{server.url}/simple",
                "--report",
                str(report),
                requirement,
            ],
            env=env,
            cwd=tmp,
            text=True,
            capture_output=True,
            timeout=600,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(report.read_text()), server.paths, proc.stdout, server.url


def check_pip_used_the_index(dist: Path, wheel: Path, version: str, tmp: Path) -> None:
    report, paths, out, url = pip_dry_run(dist, f"vllm=={version}", tmp)
    (item,) = report["install"]
    assert item["metadata"]["name"] == "vllm"
    assert item["metadata"]["version"] == version
    quoted = wheel.name.replace("+", "%2B")
    assert item["download_info"]["url"] == f"{url}/{quoted}"
    assert item["download_info"]["archive_info"]["hashes"] == {"sha256": _sha(wheel)}
    assert f"Would install vllm-{version}" in out
    # the resolver read the .metadata file (PEP 658/714), not the wheel: the
    # server was asked for the project page and that file only (the venv's pip,
    # ci/requirements-build.lock, has pypa/pip#13482: --dry-run fetches no wheel)
    got = [p for p, code in paths if code == 200]
    assert got == ["/simple/vllm/", f"/{quoted}.metadata"], paths
    assert f"Downloading {quoted}.metadata" in out


@pytest.mark.slow  # pip and a server: not while editing a patch
def test_pip_resolves_from_the_served_dist_folder(tmp_path):
    dist = tmp_path / "dist"
    wheel = make_wheel(dist)
    write_index(dist, [wheel])
    check_pip_used_the_index(dist, wheel, VERSION, tmp_path)


@pytest.mark.slow
def test_pip_resolves_the_built_wheel_from_its_index(built_wheel: Path, tmp_path):
    """The real wheel of ./build.sh (a hard link in a folder of its own: the
    shared build's dist/ stays as the build left it)."""
    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = dist / built_wheel.name
    try:
        os.link(built_wheel, wheel)
    except OSError:
        shutil.copyfile(built_wheel, wheel)
    written = write_index(dist, [wheel])
    assert [p.as_posix() for p in written] == [w.format(wheel=wheel.name) for w in WRITTEN]
    check_index(dist, wheel)
    again = _tree(dist / "simple")
    write_index(dist, [wheel])
    assert _tree(dist / "simple") == again
    version = get_line().version
    assert wheel.name.startswith(f"vllm-{version}-")
    check_pip_used_the_index(dist, wheel, version, tmp_path)


@pytest.mark.slow  # pip: not while editing a patch
def test_pip_upgrades_to_the_next_revision_through_the_index(tmp_path):
    """A user who installed revision N from the published index into a venv
    gets N+1 from `pip install --upgrade` once it is published beside N (the
    revision only grows: tpfix.maint.revision), through the index's file:// URL."""
    import venv

    dist, env = tmp_path / "dist", tmp_path / "venv"
    old, new = "0.0.1+tpfix.4", "0.0.1+tpfix.5"
    venv.create(env, with_pip=False)  # a fresh venv; this pip installs into it
    python = env / "bin" / "python"
    url = (dist / "simple").as_uri()

    def pip(*args: str) -> None:
        cmd = [sys.executable, "-m", "pip", "--python", str(python), "install"]
        cmd += ["--disable-pip-version-check", "--no-cache-dir", "--index-url", url, *args]
        proc = subprocess.run(cmd, text=True, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def installed() -> str:
        code = "import importlib.metadata as m, vllm; print(m.version('vllm'), vllm.__version__)"
        proc = subprocess.run([str(python), "-c", code], text=True, capture_output=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    first = make_wheel(dist, old, requires=())
    write_index(dist, [first])
    pip("vllm")
    assert installed() == f"{old} {old}"
    write_index(dist, [first, make_wheel(dist, new, requires=())])  # N+1 published
    pip("--upgrade", "vllm")
    assert installed() == f"{new} {new}"


def readme_install_commands() -> tuple[dict[str, str], list[str]]:
    """The README's install-from-index block: its variables and its commands,
    as written (continuation lines joined, comments dropped)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text.split("<!-- install-from-index:begin -->")[1]
    code = block.split("<!-- install-from-index:end -->")[0].split("```sh")[1].split("```")[0]
    variables, commands = {}, []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip()
        if re.fullmatch(r"[A-Z_]+=\S+", line):
            k, _, v = line.partition("=")
            variables[k] = v
        elif line:
            commands.append(line)
    return variables, commands


@pytest.mark.slow  # two servers, pip and uv, fresh venvs
def test_documented_install_commands_never_pick_upstream(tmp_path):
    """The README's pip and uv commands, run as written in a fresh venv, with
    INDEX serving our dist/ and DEPS a second local index that holds what an
    upstream index does: the line's bare release and a newer one.  Each
    installs our revision, and the next revision once it is published."""
    import venv

    public = get_line().tag[1:]
    variables, commands = readme_install_commands()
    assert set(variables) == {"INDEX", "DEPS"}
    assert [c.split(" --")[0] for c in commands] == ["pip install", "uv pip install"]
    for command in commands:
        assert command.endswith(f"'vllm=={public}'"), command
    dist, deps = tmp_path / "dist", tmp_path / "deps"
    ours = [make_wheel(dist, f"{public}+tpfix.4", requires=())]
    write_index(dist, ours)
    upstream = [make_wheel(deps, v, requires=()) for v in (public, "99.0.0")]
    write_index(deps, upstream)
    uv = Path(sys.executable).parent / "uv"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    clean.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1")
    with Served(dist) as index, Served(deps) as dep_index:
        for n, command in enumerate(commands):
            env_dir = tmp_path / f"venv{n}"
            venv.create(env_dir, with_pip=command.startswith("pip "))
            env = dict(clean, VIRTUAL_ENV=str(env_dir), PATH=f"{env_dir}/bin:{clean['PATH']}")
            env.update(INDEX=f"{index.url}/simple", DEPS=f"{dep_index.url}/simple")
            env.update(UV_CACHE_DIR=str(tmp_path / "uv-cache"), PIP_NO_CACHE_DIR="1")
            text = command
            for k in ("INDEX", "DEPS"):  # what the shell does with the README's variables
                text = text.replace(f"${k}", env[k])
            argv = shlex.split(text)
            argv = [str(uv) if argv[0] == "uv" else str(env_dir / "bin" / "pip"), *argv[1:]]

            def install(argv=argv, env=env, env_dir=env_dir) -> str:
                proc = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=300)
                assert proc.returncode == 0, (argv, proc.stdout + proc.stderr)
                code = "import importlib.metadata as m; print(m.version('vllm'))"
                out = subprocess.run(
                    [str(env_dir / "bin" / "python"), "-c", code], text=True, capture_output=True
                )
                return out.stdout.strip()

            assert install() == f"{public}+tpfix.4", command
            ours.append(make_wheel(dist, f"{public}+tpfix.5", requires=()))
            write_index(dist, ours)  # the next revision published
            assert install() == f"{public}+tpfix.5", command
            ours.pop().unlink()
            write_index(dist, ours)


@pytest.mark.slow  # two servers, uv, fresh venvs
def test_the_readme_uv_pin_takes_only_vllm_from_our_index(tmp_path):
    """An unverified folder holding a planted dependency (a newer `dep-x`
    beside our wheel, as the release engineer planted torch): the README's
    plain uv command takes it, since uv asks our index first; the README's
    pinned form (its pyproject.toml and command, as written) takes vllm from
    ours and the dependency from DEPS."""
    import tomllib
    import venv

    public = get_line().tag[1:]
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text.split("<!-- uv-pinned-index:begin -->")[1].split("<!-- uv-pinned-index:end -->")[0]
    toml_text = block.split("```toml")[1].split("```")[0]
    (command,) = [ln for ln in block.split("```sh")[1].split("```")[0].splitlines() if ln]
    _, plain = readme_install_commands()
    dist, deps = tmp_path / "dist", tmp_path / "deps"
    ours = make_wheel(dist, f"{public}+tpfix.4", requires=("dep-x",))
    write_index(dist, [ours, make_wheel(dist, "9.0", "dep_x", ())])  # the planted one
    write_index(deps, [make_wheel(deps, "1.0", "dep_x", ()), make_wheel(deps, public, requires=())])
    uv = Path(sys.executable).parent / "uv"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    clean.update(UV_NO_CONFIG="1", UV_CACHE_DIR=str(tmp_path / "uv-cache"))
    with Served(dist) as index, Served(deps) as dep_index:
        pinned = toml_text.replace("http://HOST:8000/simple", f"{index.url}/simple")
        assert tomllib.loads(pinned)["tool"]["uv"]["sources"] == {"vllm": {"index": "tpfix"}}
        (tmp_path / "pyproject.toml").write_text(pinned)
        got = {}
        for what, cmd in {"plain": plain[1], "pinned": command}.items():
            env_dir = tmp_path / f"venv-{what}"
            venv.create(env_dir)
            env = dict(clean, VIRTUAL_ENV=str(env_dir), DEPS=f"{dep_index.url}/simple")
            env["INDEX"] = f"{index.url}/simple"
            for k in ("INDEX", "DEPS"):
                cmd = cmd.replace(f"${k}", env[k])
            argv = [str(uv), *shlex.split(cmd)[1:]]
            proc = subprocess.run(argv, env=env, cwd=tmp_path, text=True, capture_output=True)
            assert proc.returncode == 0, (argv, proc.stderr)
            listed = subprocess.run(
                [str(uv), "pip", "list", "--format", "json"],
                env=env,
                text=True,
                capture_output=True,
            )
            got[what] = {p["name"]: p["version"] for p in json.loads(listed.stdout)}
    assert got["plain"] == {"vllm": f"{public}+tpfix.4", "dep-x": "9.0"}  # the planted one
    assert got["pinned"] == {"vllm": f"{public}+tpfix.4", "dep-x": "1.0"}
