# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 1, fetch (scripts/tpfix/stages/fetch.py), with the real pip against a tiny
package index served on 127.0.0.1 from tmp_path: a made-up project's wheel
and sdist (a few hundred bytes), the download cache in tmp_path
(VLLM_DIST_CACHE).  pip is cut off from this machine's configuration
(PIP_CONFIG_FILE, PIP_FIND_LINKS, proxies) and from its own HTTP cache.

Tested: a pinned wheel is fetched into cache/sha256/<hex>/<file> and nothing
else stays; a cache hit does not run pip; a cache entry of the right size but
other bytes is refused with a warning and replaced; a pin whose sha256 or
size is not the served file's, or whose filename is not what pip downloads,
is refused in one line with nothing left in the cache; pip's other failures
come back with the end of its output; a full disk (pip's output simulated)
is an OSError ENOSPC for the pipeline to report; pin_release pins the sdist
and both arches' wheels from the downloaded files.

Already tested elsewhere, not here: check_file's size message
(test_bad_input.py::test_truncated_file_is_named_with_sizes_and_hashes), a
truncated cache entry and the wrong hash against the real index (slow,
test_bad_input.py), "is not available" with PIP_NO_INDEX
(test_bad_input.py::test_lock_of_a_killed_build_does_not_block).
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from served import Served
from wheels import make_wheel

from tpfix.core.lines import PINS, Artifact, get_line, line_names
from tpfix.core.util import Fail
from tpfix.stages import fetch

PROJECT = "tpfix-standin"  # a made-up project: no real index serves it
VERSION = "1.0"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sdist(folder: Path) -> Path:
    """A minimal setuptools sdist (pip prepares its metadata with this venv's
    setuptools: --no-build-isolation, as for vLLM's)."""
    base = f"tpfix_standin-{VERSION}"
    files = {
        "pyproject.toml": (
            '[build-system]\nrequires = ["setuptools"]\n'
            'build-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "{PROJECT}"\nversion = "{VERSION}"\n'
            "[tool.setuptools]\npy-modules = []\n"
        ),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: {VERSION}\n",
    }
    out = folder / f"{base}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


class _Index(Served):
    """A PEP 503 index on 127.0.0.1 (tests/served.py): /simple/<project>/
    links each file of files/; `paths` records every request."""

    def __init__(self, root: Path):
        self.files = root / "files"
        self.files.mkdir(parents=True)
        self.root = root
        super().__init__(root)

    def publish(self, *names: str) -> None:
        """The project page lists `names` (served from files/, present or not)."""
        page = self.root / "simple" / PROJECT / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="../../files/{n}">{n}</a>\n' for n in names)
        page.write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")

    def downloads(self) -> list[str]:
        return [p for p, _ in self.paths if p.startswith("/files/")]


@pytest.fixture
def index(tmp_path: Path, monkeypatch):
    """The served index, pip pointed at it (and nothing else), the cache in tmp_path."""
    for var in list(os.environ):
        if var.startswith("PIP_") or var.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.delenv(var)
    with _Index(tmp_path / "served") as idx:
        monkeypatch.setenv("PIP_INDEX_URL", f"{idx.url}/simple/")
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
        monkeypatch.setenv("PIP_RETRIES", "0")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setenv("VLLM_DIST_CACHE", str(tmp_path / "cache"))
        yield idx


@pytest.fixture
def wheel(index: _Index) -> Path:
    """A served pure-Python wheel of the made-up project."""
    w = make_wheel(index.files, VERSION, name="tpfix_standin", requires=())
    index.publish(w.name)
    return w


def _pin(path: Path, **change) -> Artifact:
    art = Artifact(PROJECT, VERSION, "test", path.name, path.stat().st_size, _sha(path))
    return replace(art, **change)


def _cache_files(cache: Path) -> list[Path]:
    """Every file in the cache but its lock files."""
    return sorted(p for p in cache.rglob("*") if p.is_file() and "locks" not in p.parts)


def test_a_pinned_wheel_is_fetched_into_the_cache_once(
    tmp_path: Path, index: _Index, wheel: Path, monkeypatch
):
    got = fetch.fetch(_pin(wheel))
    cache = tmp_path / "cache"
    assert got == cache / "sha256" / _sha(wheel) / wheel.name
    assert got.read_bytes() == wheel.read_bytes()
    assert index.downloads() == [f"/files/{wheel.name}"]
    assert _cache_files(cache) == [got]  # pip's private folder is gone
    assert fetch.cached_path(_pin(wheel)) == got

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran for a file in the cache")

    monkeypatch.setattr(fetch, "_pip_download", no_pip)  # a cache hit runs no pip
    assert fetch.fetch(_pin(wheel)) == got
    assert index.downloads() == [f"/files/{wheel.name}"]


def test_a_changed_cache_entry_is_refetched(tmp_path: Path, index: _Index, wheel: Path, capsys):
    """The size is right, a byte is not (check_file's sha256 branch): the
    entry is refused with a warning and replaced by a verified download."""
    entry = fetch.cached_path(_pin(wheel))
    entry.parent.mkdir(parents=True)
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1
    entry.write_bytes(bytes(data))
    assert fetch.fetch(_pin(wheel)) == entry
    assert entry.read_bytes() == wheel.read_bytes()
    err = capsys.readouterr().err
    assert f"warning: cache entry rejected, refetching: {wheel.name}: sha256 mismatch" in err
    assert f"got {hashlib.sha256(bytes(data)).hexdigest()}" in err
    assert index.downloads() == [f"/files/{wheel.name}"]


def test_a_pin_of_another_file_is_refused_and_nothing_cached(
    tmp_path: Path, index: _Index, wheel: Path
):
    other = hashlib.sha256(b"the file the pin was made from").hexdigest()
    with pytest.raises(Fail) as e:
        fetch.fetch(_pin(wheel, sha256=other))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (
        f"{wheel.name}: sha256 mismatch: expected {other}, got {_sha(wheel)}; the index "
        "serves a different file than the pin. Check the release before changing the pin."
    )
    assert index.downloads() == [f"/files/{wheel.name}"]  # pip did download it
    assert _cache_files(tmp_path / "cache") == []


def test_a_pin_of_another_size_is_refused_and_nothing_cached(
    tmp_path: Path, index: _Index, wheel: Path
):
    """The hash is all pip checks: the size is fetch's own check."""
    size = wheel.stat().st_size
    with pytest.raises(Fail) as e:
        fetch.fetch(_pin(wheel, size=size + 1))
    assert str(e.value).startswith(f"{wheel.name}: {size} bytes, the pin says {size + 1}")
    assert index.downloads() == [f"/files/{wheel.name}"]
    assert _cache_files(tmp_path / "cache") == []


def test_a_pin_naming_another_file_names_what_pip_downloaded(
    tmp_path: Path, index: _Index, wheel: Path
):
    pinfile = tmp_path / "pins.toml"
    with pytest.raises(Fail) as e:
        fetch.fetch(_pin(wheel, filename="tpfix_standin-1.0-py3-none-other.whl"), pinfile)
    assert str(e.value) == (
        f"tpfix_standin-1.0-py3-none-other.whl: pip downloaded {[wheel.name]} instead; "
        f"check the filename in {pinfile}"
    )
    assert _cache_files(tmp_path / "cache") == []


def test_another_pip_failure_shows_the_end_of_its_output(
    tmp_path: Path, index: _Index, wheel: Path
):
    """The index lists a file it does not serve (404): no hash or version
    problem, so the error is the last lines of pip's own output."""
    gone = f"tpfix_standin-{VERSION}-py2.py3-none-any.whl"
    index.publish(gone)
    with pytest.raises(Fail) as e:
        fetch.fetch(_pin(wheel, filename=gone))
    head, *tail = str(e.value).splitlines()
    assert head == f"{gone}: pip download failed:"
    assert 1 <= len(tail) <= 8
    assert all(ln.startswith("  ") for ln in tail)
    assert "404" in "\n".join(tail)
    assert _cache_files(tmp_path / "cache") == []


def test_a_full_disk_during_pip_is_an_enospc_error(tmp_path: Path, monkeypatch):
    """Simulated: pip's output ends saying the disk is full."""
    monkeypatch.setenv("VLLM_DIST_CACHE", str(tmp_path / "cache"))
    text = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"

    def full_disk(art, requirement, out):
        return subprocess.CompletedProcess([], 1, "", text)

    monkeypatch.setattr(fetch, "_pip_download", full_disk)
    art = Artifact(PROJECT, VERSION, "test", "x-1.0-py3-none-any.whl", 1, "0" * 64)
    with pytest.raises(OSError) as e:
        fetch.fetch(art)
    assert not isinstance(e.value, Fail)
    assert e.value.errno == errno.ENOSPC
    assert Path(e.value.filename).parent == tmp_path / "cache" / "tmp"


def test_pin_release_pins_the_downloaded_sdist_and_wheels(tmp_path: Path, index: _Index):
    """The sdist and a wheel per arch, as pip picks them for each platform
    (the pin names the platform of the downloaded file)."""
    sdist = _sdist(index.files)
    plats = {"x86_64": "manylinux_2_28_x86_64", "aarch64": "manylinux_2_28_aarch64"}
    built = make_wheel(tmp_path / "w", VERSION, name="tpfix_standin", requires=())
    wheels = {}
    for arch, plat in plats.items():
        w = index.files / built.name.replace("-any.whl", f"-{plat}.whl")
        # a different file per arch, as the official wheels are
        w.write_bytes(built.read_bytes() + arch.encode())
        wheels[arch] = w
    index.publish(sdist.name, *(w.name for w in wheels.values()))
    arts = fetch.pin_release(PROJECT, VERSION)
    expected = [_pin(sdist, role="sdist")] + [
        _pin(w, role="wheel", arch=arch, platform=plats[arch]) for arch, w in wheels.items()
    ]
    assert sorted(arts, key=str) == sorted(expected, key=str)
    for art in arts:  # in the cache under their hashes, so a fetch needs no download
        assert fetch.cached_path(art).read_bytes() == (index.files / art.filename).read_bytes()
    assert not any((tmp_path / "cache" / "tmp").iterdir())


def test_pin_release_of_a_missing_release_fails_in_one_line(tmp_path: Path, index: _Index):
    index.publish()
    with pytest.raises(Fail) as e:
        fetch.pin_release(PROJECT, "9.9")
    msg = str(e.value)
    assert msg.startswith(f"{PROJECT}==9.9  sdist: pip download failed: ")
    assert "\n" not in msg
    assert _cache_files(tmp_path / "cache") == []


def test_all_pin_files_are_the_shared_pins_and_every_lines():
    files = fetch.all_pin_files()
    assert PINS / "flashinfer.toml" in files
    for name in line_names():
        assert get_line(name).pins in files, name
    assert len(files) == len(set(files)) and all(f.is_file() for f in files)


def test_an_unpinned_test_input_is_refused_naming_the_pin_file(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("VLLM_DIST_CACHE", str(tmp_path / "cache"))
    with pytest.raises(Fail) as e:
        fetch.fetch_test_dep(PROJECT, VERSION)
    assert str(e.value) == f"{PINS / 'flashinfer.toml'}: no pin for {PROJECT}=={VERSION}"
    assert not (tmp_path / "cache").exists()
