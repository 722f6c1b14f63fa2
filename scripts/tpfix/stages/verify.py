# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 4: compare the built wheel with the official one, file by file.

Allowed differences, and nothing else:
  * the dist-info folder name and RECORD (they carry the version);
  * METADATA: the Version, and Requires-Dist lines of projects whose pin the
    series changes in requirements/*.txt;
  * vllm/_version.py (version string and commit id);
  * files the series touches under vllm/ (added or changed), which must equal
    the patched tree byte for byte.
Every compiled binary, and every other file, must be byte-identical.

    python -m tpfix.stages.verify BUILT.whl OFFICIAL.whl PATCHED_TREE
"""

from __future__ import annotations

import argparse
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from tpfix.core.lines import Line
from tpfix.core.patch_format import diff_files, read_series
from tpfix.core.util import Fail, main_wrapper, shown
from tpfix.core.wheelfile import parse_metadata, requirements

if TYPE_CHECKING:
    from tpfix.core.context import BuildContext

_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def touched_files(line: Line, names: list[str] | None = None) -> set[str]:
    """Paths (relative to the tree) that `line`'s series (or its `names`) adds or changes."""
    names = read_series(line.series) if names is None else names
    return {d.new for name in names for d in diff_files(line.patches / name) if d.new}


def _norm(name: str) -> str:
    return re.sub(r"^[^/]*\.dist-info/", "DIST-INFO/", name)


def _project(req: str) -> str:
    m = _REQ_NAME.match(req)
    return canonicalize_name(m.group(1)) if m else req


def _changed_pins(touched: set[str], tree: Path) -> set[str]:
    """Projects named on lines of touched requirements files."""
    projects = set()
    for path in touched:
        if path.startswith("requirements/") and (tree / path).exists():
            for line in (tree / path).read_text().splitlines():
                line = line.strip()  # pip allows indented options and comments
                if line and not line.startswith(("#", "-")):
                    projects.add(_project(line))
    return projects


def verify_wheel(built: Path, official: Path, tree: Path, ctx: BuildContext) -> list[str]:
    """Return a list of human-readable differences that are not allowed
    between `built` (from `tree`, the context's series applied) and `official`."""
    problems: list[str] = []
    version = ctx.version
    touched = touched_files(ctx.line, list(ctx.series))
    with zipfile.ZipFile(built) as b, zipfile.ZipFile(official) as o:
        bn = {_norm(n): n for n in b.namelist()}
        on = {_norm(n): n for n in o.namelist()}
        for extra in sorted(set(bn) - set(on)):
            if extra not in touched:
                problems.append(f"{extra}: in the built wheel only")
            elif b.read(bn[extra]) != (tree / extra).read_bytes():
                problems.append(f"{extra}: added file differs from the patched tree")
        for gone in sorted(set(on) - set(bn)):
            problems.append(f"{gone}: missing from the built wheel")
        for key in sorted(set(bn) & set(on)):
            bb, ob = b.read(bn[key]), o.read(on[key])
            if key in touched:
                if bb != (tree / key).read_bytes():
                    problems.append(f"{key}: patched file differs from the patched tree")
                continue
            # the files that carry the version: checked even where equal to
            # the official wheel's (that is a wheel still saying upstream's)
            if key == "vllm/_version.py":
                if f"'{version}'" not in bb.decode():
                    problems.append(f"{key}: does not carry version {version}")
                continue
            if key == "DIST-INFO/METADATA":
                problems += _metadata_problems(
                    bb.decode(), ob.decode(), version, tree, touched, (built, official)
                )
                continue
            if bb == ob or key == "DIST-INFO/RECORD":
                continue
            kind = "compiled binary" if key.endswith((".so", ".cubin")) else "file"
            problems.append(f"{key}: {kind} differs from the official wheel")
        if not any(k.startswith("DIST-INFO/") for k in bn):
            problems.append("no dist-info folder in the built wheel")
        infos = sorted({n.split("/")[0] for n in bn.values() if _norm(n) != n})
        if infos and infos != [f"vllm-{version}.dist-info"]:
            problems.append(f"{', '.join(infos)}: expected vllm-{version}.dist-info")
    return problems


def _metadata_problems(
    built: str,
    official: str,
    version: str,
    tree: Path,
    touched: set[str],
    wheels: tuple[Path, Path],
) -> list[str]:
    bm, om = parse_metadata(built), parse_metadata(official)
    problems = []
    if bm["Version"] != version:
        problems.append(f"METADATA: Version is {bm['Version']}, expected {version}")
    for key in set(bm.keys()) | set(om.keys()):
        if key in ("Version", "Requires-Dist"):
            continue
        if bm.get_all(key) != om.get_all(key):
            problems.append(f"METADATA: {key} differs from the official wheel")
    if bm.get_payload() != om.get_payload():
        problems.append("METADATA: description differs from the official wheel")
    breqs, oreqs = (requirements(m, f"{shown(w)}: METADATA") for m, w in zip((bm, om), wheels))
    allowed = _changed_pins(touched, tree)
    for req in sorted(set(breqs) ^ set(oreqs), key=str):
        if canonicalize_name(req.name) not in allowed:
            problems.append(f"METADATA: Requires-Dist {str(req)!r} changed, no patch pins it")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("built", type=Path)
    ap.add_argument("official", type=Path)
    ap.add_argument("tree", type=Path)
    ap.add_argument("--line", help="release line (default: the pinned tag)")
    args = ap.parse_args()
    from tpfix.core.context import BuildContext
    from tpfix.core.lines import get_line

    ctx = BuildContext.resolve(get_line(args.line))
    problems = verify_wheel(args.built, args.official, args.tree, ctx)
    if problems:
        raise Fail(
            f"{args.built.name} does not match the official wheel:\n  " + "\n  ".join(problems)
        )
    print(f"{args.built.name}: verified against {args.official.name}")


if __name__ == "__main__":
    main_wrapper(main)
