# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""python -m tpfix.maint.watch on made-up trees (two lines, pins/, a lock)
against a local index of tiny wheels served on 127.0.0.1 (tests/served.py),
and on this repository's own layout against index pages made to satisfy it."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from served import Served
from wheels import make_wheel

from tpfix.core.lines import line_names, load_pins, read_pin_file
from tpfix.core.util import ROOT, Fail
from tpfix.maint import watch
from tpfix.maint.lock import read_lock

SHA = hashlib.sha256


def sha(path: Path) -> str:
    return SHA(path.read_bytes()).hexdigest()


def publish(index: Path, yanked: tuple[str, ...] = ()) -> None:
    """index/simple/<project>/index.html (PEP 503) over the files of index/files."""
    pages: dict[str, list[str]] = {}
    for f in sorted((index / "files").iterdir()):
        name = canonicalize_name(f.name.split("-")[0])
        mark = " data-yanked" if f.name in yanked else ""
        pages.setdefault(name, []).append(
            f'<a href="../../files/{f.name}#sha256={sha(f)}"{mark}>{f.name}</a>'
        )
    write_pages(index, pages)


def write_pages(index: Path, pages: dict[str, list[str]]) -> None:
    for name, anchors in pages.items():
        page = index / "simple" / name / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>")


def sdist(folder: Path, name: str, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}.tar.gz"
    path.write_bytes(f"sdist of {name} {version}".encode())
    return path


def add_line(root: Path, files: Path, version: str, flashinfer: str) -> None:
    """patches/v<version>/ pinning the sdist and a wheel of vllm <version>
    (made in `files`), re-pinning flashinfer-python to `flashinfer`."""
    arts = [sdist(files, "vllm", version), make_wheel(files, version, requires=())]
    folder = root / "patches" / f"v{version}"
    folder.mkdir(parents=True)
    (folder / "VERSION").write_text(f"{version}+tpfix.1\n")
    text = f'tag = "v{version}"\ncuda = "13.0"\ntorch = "2.0.0"\nflashinfer = "0.5.0"\n'
    text += f'flashinfer-repinned = "{flashinfer}"\n'
    for role, art in zip(("sdist", "wheel"), arts):
        text += (
            f'\n[[artifact]]\nproject = "vllm"\nversion = "{version}"\nrole = "{role}"\n'
            f'filename = "{art.name}"\nsize = {art.stat().st_size}\nsha256 = "{sha(art)}"\n'
        )
    (folder / "pins.toml").write_text(text)


def lock_entry(wheel: Path, version: str, digest: str | None = None) -> str:
    name = wheel.name.split("-")[0]
    return f"{name}=={version} \\\n    --hash=sha256:{digest or sha(wheel)}\n"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """(root, index, links): two lines (v1.0.0, v1.1.0) and a lock whose
    files index/ serves, but the lock's torch==2.0.0+cpu, which lies in links/
    only; pip's own configuration is not read (watch.pip_config: nothing)."""
    monkeypatch.setattr(watch, "pip_config", dict)
    root, index, links = tmp_path / "root", tmp_path / "index", tmp_path / "links"
    files = index / "files"
    add_line(root, files, "1.0.0", "0.5.1")
    add_line(root, files, "1.1.0", "0.6.0")
    for name, version in (("flashinfer_python", "0.5.1"), ("flashinfer_python", "0.6.0")):
        make_wheel(files, version, name=name, requires=())
    six = make_wheel(files, "1.0.0", name="six", requires=())
    make_wheel(files, "2.0.0", name="torch", requires=())
    cpu = make_wheel(links, "2.0.0+cpu", name="torch", requires=())
    (root / "ci").mkdir()
    (root / "ci" / "requirements-test.lock").write_text(
        "# a lock\n" + lock_entry(six, "1.0.0") + lock_entry(cpu, "2.0.0+cpu")
    )
    publish(index)
    return root, index, links


def run(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as end:
        watch.main(["--root", str(root), *args])
    out, err = capsys.readouterr()
    return end.value.code, out, err


def run_served(capsys, tree, *args: str) -> tuple[int, str, str]:
    root, index, links = tree
    with Served(index) as server:
        url = f"{server.url}/simple"
        return run(capsys, root, "--index-url", url, "--find-links", str(links), *args)


def acts(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("!")]


def test_clean_tree_exits_0_and_the_cpu_torch_comes_from_find_links(tree, capsys):
    code, out, err = run_served(capsys, tree)
    assert code == 0, out + err
    assert out.splitlines()[-1] == "nothing to act on"
    assert "torch==2.0.0+cpu: from find-links" in out
    # v1.0.0: its 2 pinned files, torch and FlashInfer; the newer FlashInfer
    # is another minor's, and vllm 1.1.0 has its own line
    assert "v1.0.0 (vllm 1.0.0, flashinfer-python 0.5.1, torch 2.0.0): 4 of 4 pins served" in out
    assert "flashinfer-python newer outside 0.5.x: 0.6.0" in out
    assert "v1.1.0 (vllm 1.1.0, flashinfer-python 0.6.0, torch 2.0.0): 4 of 4 pins served" in out


def test_newer_vllm_and_flashinfer_releases_are_reported(tree, capsys):
    root, index, links = tree
    files = index / "files"
    for version in ("1.0.1", "1.2.0", "1.3.0rc1", "1.4.0"):
        make_wheel(files, version, requires=())
    for version in ("0.5.2", "0.7.0"):
        make_wheel(files, version, name="flashinfer_python", requires=())
    publish(index, yanked=("vllm-1.4.0-py3-none-any.whl",))
    code, out, _ = run_served(capsys, tree)
    assert code == 1
    # v1.0.0: its own 1.0 series; 1.2.0 is the newest line's to act on;
    # the pre-release and the yanked release are not releases
    assert acts(out) == [
        "! vllm newer than 1.0.0: 1.0.1",
        "! flashinfer-python newer than 0.5.1: 0.5.2",
        "! vllm newer than 1.1.0: 1.2.0 (no line yet: python -m tpfix.maint.start_line v1.2.0)",
    ], out
    assert "vllm newer outside 1.0.x: 1.2.0" in out  # 1.1.0 has a line
    assert "flashinfer-python newer outside 0.5.x: 0.6.0, 0.7.0" in out
    assert "flashinfer-python newer outside 0.6.x: 0.7.0" in out
    assert "1.3.0rc1" not in out and "1.4.0" not in out
    assert out.splitlines()[-1] == "to act on: 3 (marked !)"
    code, out, _ = run_served(capsys, tree, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["act"] == 3
    first = {s["name"]: s["items"] for s in doc["sections"]}["v1.0.0"]
    assert {"status": "act", "project": "vllm", "new": ["1.0.1"]}.items() <= first[0].items()


@pytest.mark.parametrize("how", ["gone", "other sha256"])
def test_a_pin_the_index_no_longer_serves_is_broken_naming_the_file(tree, capsys, how):
    root, index, links = tree
    pinned = index / "files" / "vllm-1.1.0.tar.gz"
    if how == "gone":
        pinned.unlink()
    else:
        pinned.write_bytes(b"another upload")
    publish(index)
    code, out, _ = run_served(capsys, tree)
    why = "not served" if how == "gone" else f"served with another sha256 ({sha(pinned)[:12]}…)"
    assert code == 1
    assert acts(out) == [f"! vllm-1.1.0.tar.gz: {why}"]


@pytest.mark.parametrize("how", ["version", "hash", "find-links"])
def test_a_lock_entry_the_index_lacks_is_reported(tree, capsys, how):
    root, index, links = tree
    lock = root / "ci" / "requirements-test.lock"
    six = index / "files" / "six-1.0.0-py3-none-any.whl"
    if how == "version":
        lock.write_text(lock.read_text().replace("six==1.0.0", "six==1.0.1"))
    elif how == "hash":
        lock.write_text(lock.read_text().replace(sha(six), "0" * 64))
    else:  # the CPU torch is nowhere once find-links lack it
        (links / "torch-2.0.0+cpu-py3-none-any.whl").unlink()
    code, out, _ = run_served(capsys, tree)
    want = {
        "version": "! six==1.0.1: not served",
        "hash": f"! six==1.0.0: served with another sha256 ({sha(six)[:12]}…)",
        "find-links": "! torch==2.0.0+cpu: not served",
    }
    assert code == 1 and acts(out) == [want[how]], out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_index_reachable_is_one_line_and_exit_3(tree, capsys):
    root, _, _ = tree
    url = f"http://127.0.0.1:{closed_port()}/simple"
    start = time.monotonic()
    code, out, err = run(capsys, root, "--index-url", url, "--find-links", str(tree[2]))
    assert (code, out) == (watch.NO_INDEX, "")
    assert err.count("\n") == 1 and err.startswith(f"error: no package index reachable ({url}: ")
    assert time.monotonic() - start < 10


def test_pip_configuration_names_the_indexes_and_find_links(tree, capsys, monkeypatch):
    """Without options, the indexes and find-links are pip's (here PIP_* variables)."""
    monkeypatch.undo()  # the real pip_config
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    url = f"http://127.0.0.1:{closed_port()}/simple"
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tree[2]))
    assert watch.pip_config().items() >= {"index-url": url, "find-links": str(tree[2])}.items()
    code, _, err = run(capsys, tree[0])
    assert code == watch.NO_INDEX and f"({url}: " in err
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    code, _, err = run(capsys, tree[0])
    assert code == watch.NO_INDEX and "no-index" in err


def test_the_simple_json_api_is_read_too():
    body = json.dumps({"files": [
        {"filename": "vllm-1.0.0.tar.gz", "url": "x", "hashes": {"sha256": "a" * 64}},
        {"filename": "vllm-1.1.0.tar.gz", "url": "y", "hashes": {}, "yanked": "broken"},
        {"filename": "not-a-release.txt", "url": "z", "hashes": {}},
    ]}).encode()  # fmt: skip
    got = watch.parse_page(body, "application/vnd.pypi.simple.v1+json", "http://h/", "index")
    assert [(f.filename, f.sha256, f.yanked) for f in got] == [
        ("vllm-1.0.0.tar.gz", "a" * 64, False),
        ("vllm-1.1.0.tar.gz", None, True),
    ]


def test_this_repository_against_pages_that_satisfy_it(tmp_path, capsys, monkeypatch):
    """The real lines, pins/ and locks: pages list each pinned file with its
    sha256 and each lock pin's hashes (no file behind them: watch reads pages
    only), and the versions each line's wheel requires."""
    monkeypatch.setattr(watch, "pip_config", dict)
    pages: dict[str, list[str]] = {}

    def listed(project: str, filename: str, digest: str) -> None:
        anchor = f'<a href="../../files/{filename}#sha256={digest}">{filename}</a>'
        pages.setdefault(canonicalize_name(project), []).append(anchor)

    for pins in [*ROOT.glob("patches/v*/pins.toml"), *ROOT.glob("pins/*.toml")]:
        for art in load_pins(pins):
            listed(art.project, art.filename, art.sha256)
        if torch := read_pin_file(pins).get("torch"):  # the lines' (the locks': +cpu)
            listed("torch", f"torch-{torch}-py3-none-any.whl", "0" * 64)
    for lock in ROOT.glob("ci/requirements-*.lock"):
        for pin in read_lock(lock).values():
            wheel = f"{pin.name.replace('-', '_')}-{pin.version}-py3-none-any.whl"
            for i, digest in enumerate(pin.hashes):
                listed(pin.name, wheel.replace("-py3-", f"-{i}-py3-"), digest)
    write_pages(tmp_path, pages)
    with Served(tmp_path) as server:
        code, out, err = run(capsys, ROOT, "--index-url", f"{server.url}/simple")
    assert code == 0, out + err
    assert not acts(out) and out.splitlines()[-1] == "nothing to act on"
    assert {*line_names(), "pins/flashinfer.toml", "ci/requirements-build.lock"} <= {
        line.split(":")[0].split(" (")[0] for line in out.splitlines()
    }


def test_bad_input_exits_2_and_the_module_runs(tmp_path):
    """`python -m tpfix.maint.watch` on a tree without lines: one error line, exit 2."""
    url = f"http://127.0.0.1:{closed_port()}/simple"
    cmd = [sys.executable, "-m", "tpfix.maint.watch", "--root", str(tmp_path), "--index-url", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: ")
    assert "no release line" in done.stderr and done.stderr.count("\n") == 1


def test_a_line_without_its_runtime_versions_is_bad_input(tree, capsys):
    pins = tree[0] / "patches" / "v1.1.0" / "pins.toml"
    pins.write_text(pins.read_text().replace('torch = "2.0.0"', ""))
    with pytest.raises(Fail, match="v1.1.0/pins.toml: `torch`, `flashinfer` must name versions"):
        run_served(capsys, tree)
