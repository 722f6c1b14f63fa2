# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The layout of scripts/tpfix as docs/design.md draws it: one folder per
concern, listed in the order imports run (each folder imports only what is
listed below it), every folder in that list and every module at most 500
lines.  Read from the source with ast (the imports inside functions too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tpfix.core.util import ROOT

PKG = ROOT / "scripts" / "tpfix"


def _design_order() -> list[str]:
    """The rooms of scripts/tpfix in the order docs/design.md lists them."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text[text.index("scripts/tpfix/ ") : text.index("\nbuild.sh ")]
    return [m[1].rstrip("/").removesuffix(".py") for m in re.finditer(r"(?m)^  (\S+)", block)]


def _room(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported_rooms(path: Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "tpfix":
                continue
            if len(parts) > 1:
                rooms.add(parts[1])
            else:  # from tpfix import x: x is a room
                rooms |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            rooms |= {a.name.split(".")[1] for a in node.names if a.name.startswith("tpfix.")}
    return rooms


def test_every_room_is_in_the_design_and_imports_run_down_its_list():
    order = _design_order()
    modules = [p for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent != PKG]
    rooms = {_room(p) for p in modules}
    assert rooms == set(order), (sorted(rooms), order)
    up = []
    for path in modules:
        mine = order.index(_room(path))
        for other in _imported_rooms(path) - {_room(path)}:
            if order.index(other) < mine:
                up.append(f"{path.relative_to(PKG)} imports {other}/, listed above it")
    assert not up, up


def test_every_module_is_at_most_500_lines():
    long = {
        str(p.relative_to(PKG)): n
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, long


def test_the_drawing_would_see_an_upward_import(tmp_path):
    """The check above is not vacuous: an import of a room listed above is found."""
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from tpfix.image.image import build_image\n")
    assert _imported_rooms(bad) == {"image"}
    order = _design_order()
    assert order.index("image") < order.index("core")
    assert order[0] == "pipeline" and order[-1] == "core"
