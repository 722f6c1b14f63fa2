# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The docs name only paths that exist: every repository path that README.md,
docs/*.md and the patch lines' CHANGELOG.md name (in backticks or as a link)
under a folder or file this repository tracks at its top.  Paths with
placeholders (<tag>, *, {a,b}) and what a build writes (build/, dist/) are
not checked.  And every `python -m tpfix.X` a doc, build.sh, ci/*.sh or the
Dockerfile runs names a module that exists."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from tpfix.core.util import ROOT

DOCS = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("patches/*/CHANGELOG.md")]
)
TOP = {
    p.split("/", 1)[0]
    for p in subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
}
# `code` or a Markdown link's target
NAMED = re.compile(r"`([^`\s]+)`|\]\(([^)\s#]+)")


def named_paths(doc: Path) -> list[str]:
    out = []
    for m in NAMED.finditer(doc.read_text()):
        text = (m.group(1) or m.group(2)).rstrip(".,:;")
        if m.group(2):  # a link: relative to the document
            if "://" in text or text.startswith("mailto:"):
                continue
            text = (doc.parent / text).resolve().relative_to(ROOT).as_posix()
        text = text.removeprefix("./")
        first = text.split("/", 1)[0]
        if first not in TOP or "/" not in text and not Path(ROOT, text).suffix:
            continue
        if any(c in text for c in "<>*{}$[]"):
            continue
        if any(re.fullmatch(r"[A-Z_]+", part) for part in text.split("/")[:-1]):
            continue  # a placeholder folder: patches/TAG/pins.toml
        out.append(text.split("::")[0])
    return out


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(ROOT).as_posix() for d in DOCS])
def test_every_path_a_doc_names_exists(doc: Path):
    missing = sorted({p for p in named_paths(doc) if not (ROOT / p).exists()})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_check_sees_paths():
    """It reads paths at all: the README names build.sh and ci/test.sh."""
    assert {"build.sh", "ci/test.sh"} <= set(named_paths(ROOT / "README.md"))


def test_a_missing_path_is_reported(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text("Run `scripts/tpfix/no_such_stage.py`, see `patches/TAG/pins.toml`.\n")
    named = named_paths(doc)
    assert named == ["scripts/tpfix/no_such_stage.py"]  # the placeholder one is skipped
    assert not (ROOT / named[0]).exists()


# `python -m tpfix.<module>` (or `-m tpfix....`) in a doc or in the tooling's own texts
COMMAND = re.compile(r"-m\s+(tpfix(?:\.\w+)+)")
TEXTS = [*DOCS, ROOT / "build.sh", *ROOT.glob("ci/*.sh"), ROOT / "Dockerfile"]


def named_modules(text: str) -> set[str]:
    return set(COMMAND.findall(text))


@pytest.mark.parametrize("doc", TEXTS, ids=[d.relative_to(ROOT).as_posix() for d in TEXTS])
def test_every_module_a_doc_runs_exists(doc: Path):
    """Each `python -m tpfix.X` names a module or package that runs (a
    package has a __main__): the commands moved with scripts/tpfix's folders."""
    missing = []
    for name in sorted(named_modules(doc.read_text())):
        spec = importlib.util.find_spec(name)
        if spec is None or (
            spec.submodule_search_locations and not importlib.util.find_spec(f"{name}.__main__")
        ):
            missing.append(name)
    assert not missing, f"{doc.relative_to(ROOT)} runs modules that do not exist: {missing}"


def test_the_module_check_sees_commands():
    assert {"tpfix.image", "tpfix.release.attest"} <= named_modules(
        "python -m tpfix.image --arch all; build/venv/bin/python -m tpfix.release.attest verify"
    )
    assert importlib.util.find_spec("tpfix.stages") is not None
    assert importlib.util.find_spec("tpfix.stages.__main__") is None  # a package that won't run
