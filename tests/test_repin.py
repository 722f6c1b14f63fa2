# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""tpfix.maint.repin and start_line's use of it: an upstream pin the index
does not serve is named in one line with the way out; `--repin` becomes a
patch that moves every same-version pin; the re-pinned release is checked
against what vLLM imports of it (on small trees made here: no vLLM sdist)."""

from __future__ import annotations

import os
import subprocess
import textwrap
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from served import Served
from wheels import make_wheel, simple_index

from tpfix.core.lines import get_line, line_names
from tpfix.core.patch_format import read_series
from tpfix.core.util import Fail
from tpfix.maint import repin, start_line
from tpfix.replay import deps
from tpfix.replay.harness import flashinfer_site
from tpfix.stages.patch import cached_tree


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local index serving flashinfer-python 0.7.2.post1 and 0.7.4 and torch
    2.14.0, but not the 0.7.3 the official wheel pins; pip sees only it."""
    made = tmp_path / "made"
    wheels = [
        make_wheel(made, "0.7.2.post1", "flashinfer_python", ()),
        make_wheel(made, "0.7.4", "flashinfer_python", ()),
        make_wheel(made, "0.7.5rc1", "flashinfer_python", ()),
        make_wheel(made, "2.14.0", "torch", ()),
    ]
    simple = simple_index(tmp_path / "index", wheels)
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with Served(simple.parent) as served:
        monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
        yield served


def _official(tmp_path: Path) -> Path:
    return make_wheel(
        tmp_path / "official",
        "0.34.0",
        "vllm",
        (
            "flashinfer-python==0.7.3",
            "torch==2.14.0",
            "numpy",
            'zentorch==2.14.0.2; extra == "zen"',  # an extra: not installed by default
            'protobuf==7.36.1; platform_machine == "s390x"',  # another platform
        ),
    )


def test_an_unserved_pin_is_found_with_what_the_index_has(index, tmp_path):
    got = repin.unserved(_official(tmp_path), "3.12", "x86_64-manylinux_2_28")
    assert [(n, v) for n, v, _ in got] == [("flashinfer-python", "0.7.3")]
    assert repin.nearby("0.7.3", got[0][2]) == ["0.7.2.post1", "0.7.4"]  # no pre-release


def test_start_line_names_it_in_one_line_with_the_way_out(index, tmp_path, monkeypatch):
    wheel = _official(tmp_path)
    monkeypatch.setattr(start_line, "cached_path", lambda art: wheel)
    sdist = tmp_path / "vllm-0.34.0.tar.gz"
    pyproject = '[build-system]\nrequires = ["setuptools-rust>=1.9.0", "torch == 2.14.0"]\n'
    monkeypatch.setattr(start_line, "sdist_text", lambda s, name: pyproject)
    monkeypatch.setattr(start_line, "dockerfile_arg", lambda s, name: "22.04")  # its Ubuntu
    art = SimpleNamespace(platform="manylinux_2_28_x86_64")
    with pytest.raises(Fail) as e:
        start_line._check_release("v0.34.0", sdist, art, {"image-python": "3.12"}, {})
    assert str(e.value) == (
        "vLLM v0.34.0 pins flashinfer-python==0.7.3, which the package index does not "
        "serve (nearest: 0.7.2.post1, 0.7.4): re-pin it, python -m tpfix.maint.start_line "
        "v0.34.0 --repin flashinfer-python==VERSION (it becomes the line's first patch)"
    )
    # with the re-pin it goes on; a re-pin of something upstream does not require is refused
    start_line._check_release("v0.34.0", sdist, art, {}, {"flashinfer-python": "0.7.4"})
    refused = "--repin nothing: vLLM v0.34.0's wheel does not require nothing"
    with pytest.raises(Fail, match=refused):
        start_line._check_release(
            "v0.34.0", sdist, art, {}, {"flashinfer-python": "0.7.4", "nothing": "1"}
        )
    # an unmet build requirement of the sdist is named too
    pyproject = '[build-system]\nrequires = ["setuptools-rust>=99"]\n'
    unmet = r"requires setuptools-rust>=99; build/venv has setuptools-rust=="
    with pytest.raises(Fail, match=unmet):
        start_line._check_release("v0.34.0", sdist, art, {}, {"flashinfer-python": "0.7.4"})


def test_parse_repin():
    assert repin.parse_repin("FlashInfer_Python==0.7.4") == ("flashinfer-python", "0.7.4")
    for bad in ("flashinfer-python>=0.7.4", "flashinfer-python", "x[y]==1", "==1"):
        with pytest.raises(Fail, match="expected NAME==VERSION"):
            repin.parse_repin(bad)


def _tree(root: Path) -> Path:
    tree = root / "vllm-0.34.0"
    (tree / "requirements").mkdir(parents=True)
    (tree / "requirements" / "cuda.txt").write_text(
        "-r common.txt\ntorch==2.14.0\nflashinfer-python==0.7.3\nflashinfer-cubin==0.7.3  # same\n"
        "apache-tvm-ffi==0.1.11\n"
    )
    (tree / "requirements" / "common.txt").write_text("loguru==0.7.3\n")  # another project
    (tree / "docker").mkdir()
    (tree / "docker" / "Dockerfile").write_text(
        "FROM base\nARG FLASHINFER_VERSION=0.7.3\nARG OTHER_VERSION=0.7.3\n"
    )
    (tree / "docker" / "versions.json").write_text(
        textwrap.dedent("""\
        {
          "flashinfer": {
            "version": {
              "default": "0.7.3"
            }
          },
          "loguru": {
            "default": "0.7.3"
          }
        }
        """)
    )
    return tree


def test_the_repin_patch_moves_every_same_version_pin_and_applies_exactly(tmp_path):
    tree = _tree(tmp_path)
    text = repin.repin_patch(tree, "v0.34.0", "flashinfer-python", "0.7.3", "0.7.4", [])
    assert "Subject: [PATCH] [Deps] Re-pin flashinfer-python to 0.7.4" in text
    assert "Signed-off-by: " in text and "\n---\n" in text
    patch = tmp_path / "0001.patch"
    patch.write_text(text)
    proc = subprocess.run(
        ["patch", "-p1", "--no-backup-if-mismatch", "-F0", "-i", str(patch)],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "offset" not in proc.stdout, proc.stdout
    assert (tree / "requirements" / "cuda.txt").read_text().splitlines()[2:4] == [
        "flashinfer-python==0.7.4",
        "flashinfer-cubin==0.7.4  # same",
    ]
    assert (tree / "requirements" / "common.txt").read_text() == "loguru==0.7.3\n"
    assert (
        "ARG FLASHINFER_VERSION=0.7.4\nARG OTHER_VERSION=0.7.3"
        in (tree / "docker" / "Dockerfile").read_text()
    )
    versions = (tree / "docker" / "versions.json").read_text()
    assert '"default": "0.7.4"' in versions and versions.count('"0.7.3"') == 1  # loguru's


def test_a_repin_of_something_the_tree_does_not_pin_is_refused(tmp_path):
    with pytest.raises(Fail, match="pin no flashinfer-python==0.7.1: nothing to re-pin"):
        repin.repin_edits(_tree(tmp_path), "flashinfer-python", "0.7.1", "0.7.4")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


def test_api_problems_finds_what_the_release_lacks(tmp_path):
    site, tree = tmp_path / "site", tmp_path / "tree"
    _write(
        site,
        {
            "flashinfer/__init__.py": "from .norm import rmsnorm\nfrom .comm import *\n"
            "with contextlib.suppress(ImportError):\n    from .norm import rmsnorm as fused\n",
            "flashinfer/norm.py": "def rmsnorm(x, w, eps=1e-6, *, out=None):\n    pass\n",
            "flashinfer/comm/__init__.py": "from .ar import allreduce, Workspace\n",
            "flashinfer/comm/ar.py": (
                "def allreduce(x, **kwargs):\n    pass\nclass Workspace:\n    pass\n"
            ),
            "flashinfer/utils.py": "try:\n    from x import y as helper\nexcept ImportError:\n"
            "    helper = None\n",
        },
    )
    _write(
        tree,
        {
            "vllm/ok.py": """\
                import flashinfer
                import flashinfer.comm as fc
                from flashinfer import rmsnorm, fused
                from flashinfer.comm import allreduce, Workspace
                from flashinfer.utils import helper
                rmsnorm(1, 2, eps=3, out=4)
                fc.allreduce(1, anything=2)
                lazy = wrapper("flashinfer.norm", "rmsnorm")
                """,
            "vllm/bad.py": """\
                import flashinfer.comm as fc
                from flashinfer import rmsnorm, gone
                from flashinfer.moe import thing
                rmsnorm(1, 2, 3, 4)
                rmsnorm(1, 2, epsilon=3)
                fc.lamport()
                lazy = wrapper("flashinfer.norm", "layernorm")
                """,
            "vllm/guarded.py": """\
                try:
                    from flashinfer.moe import thing
                except ImportError:
                    thing = None
                """,
        },
    )
    problems, optional = deps.api_problems(tree, site)
    assert problems == [
        "vllm/bad.py:2: flashinfer has no gone",
        "vllm/bad.py:3: no module flashinfer.moe",
        "vllm/bad.py:4: call of rmsnorm with 4 positional arguments, it takes 3",
        "vllm/bad.py:5: call of rmsnorm with keyword 'epsilon', which it does not take",
        "vllm/bad.py:6: flashinfer.comm has no lamport",
        "vllm/bad.py:7: flashinfer.norm has no layernorm (lazy import)",
    ]
    assert optional == ["vllm/guarded.py:2: no module flashinfer.moe"]


def test_the_patch_header_lists_what_the_release_lacks(tmp_path):
    problems = ["vllm/a.py:3: flashinfer.gemm.gemm_base has no _get_cache_buf"]
    text = repin.repin_patch(
        _tree(tmp_path), "v0.34.0", "flashinfer-python", "0.7.3", "0.7.4", problems
    )
    header = text.split("\n---\n")[0]
    assert "- vllm/a.py:3: flashinfer.gemm.gemm_base has no _get_cache_buf\n" in header
    assert "must port before" in header and "every flashinfer name" not in header
    assert max(len(line) for line in header.splitlines()) <= 80
    clean = repin.repin_patch(
        _tree(tmp_path / "2"), "v0.34.0", "flashinfer-python", "0.7.3", "0.7.4", []
    )
    assert "every flashinfer name that vLLM v0.34.0 imports exists" in " ".join(clean.split())


@pytest.mark.slow  # each line's patched tree and its FlashInfer, from the sha256 cache
@pytest.mark.parametrize("tag", line_names())
def test_each_line_uses_nothing_its_flashinfer_lacks(tag):
    """The check start_line --repin makes, on every line as it ships: its
    series' tree against the FlashInfer its wheel requires (the re-pin, where
    the series re-pins it).  The only optional misses allowed are those vLLM
    guards itself."""
    line = get_line(tag)
    facts = tomllib.loads(line.pins.read_text())
    shipped = facts.get("flashinfer-repinned", facts["flashinfer"])
    tree = cached_tree(line, upto=read_series(line.series)[-1])
    problems, _ = deps.api_problems(tree, flashinfer_site(shipped))
    assert problems == []
