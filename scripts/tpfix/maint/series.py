# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Maintainer workflow for the quilt series of a release line.

    python -m tpfix.maint.series setup            # build/dev/<tag>, bound to patches/<tag>/
    python -m tpfix.maint.series push [NAME|-a]   # apply the next patch / up to NAME / all
    python -m tpfix.maint.series pop [-a]         # unapply
    python -m tpfix.maint.series new NAME.patch   # start a patch after the current top
    python -m tpfix.maint.series add FILE...      # record files before editing them
    python -m tpfix.maint.series refresh          # write the top patch back (canonical format)
    python -m tpfix.maint.series check            # series applies exactly; refresh is a no-op
    python -m tpfix.maint.series quilt ARGS...    # any other quilt command, same settings
    python -m tpfix.maint.series --line v0.33.0 setup   # the same for another line

All commands run quilt in build/dev/<tag> (default: the top-level VERSION's
line) with QUILT_PATCHES=patches/<tag>/, so a refresh edits the files in
this repository: review them with git diff.  quilt
runs through tpfix.core.quilt: every push is exact (--fuzz=0) and every refresh
uses the same canonical options (quilt.REFRESH_ARGS), which is what makes
`check` able to demand byte-for-byte reproduction; patch headers (the text
above the first diff, patch_format) are kept by quilt.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from tpfix.core.lines import Line, get_line
from tpfix.core.patch_format import read_series
from tpfix.core.quilt import Quilt, require
from tpfix.core.util import ROOT, Fail, main_wrapper, run, shown
from tpfix.stages.patch import prepare_tree

DEV = ROOT / "build" / "dev"


def dev_tree(line: Line) -> Path:
    return DEV / line.tag


def _cmd(line: Line, what: str) -> str:
    return f"python -m tpfix.maint.series --line {line.tag} {what}"


def quilt(*args: str, line: Line) -> int:
    """Run `quilt ARGS` in the line's dev tree on the terminal: push exact, refresh canonical."""
    require()
    tree = dev_tree(line)
    if not tree.exists():
        raise Fail(f"{tree} does not exist; run: {_cmd(line, 'setup')}")
    return Quilt(tree, line.patches, line.series).interactive(*args)


def setup(line: Line) -> None:
    tree = dev_tree(line)
    if tree.exists():
        raise Fail(f"{tree} exists; remove it first (rm -rf {tree})")
    prepare_tree(tree, line, "", keep_quilt_state=True)
    print(f"{tree}: pristine {line.tag}; `{_cmd(line, 'push -a')}` applies the series")


def check(line: Line) -> None:
    """Each patch of `line` applies exactly to its pristine tag in order, and
    refreshing it changes no byte."""
    patches, series, tag = line.patches, line.series, line.tag
    names = read_series(series)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "patches"
        shutil.copytree(patches, copy)
        tree = prepare_tree(Path(tmp) / "vllm", line, "")
        q = Quilt(tree, copy, copy / series.name)
        for name in names:
            q.push_exact(name, tag=tag)
            q.refresh(shown(patches / name))
            if not filecmp.cmp(patches / name, copy / name, shallow=False):
                diff = run(["diff", "-u", str(patches / name), str(copy / name)])
                raise Fail(
                    f"{shown(patches / name)}: `quilt refresh` does not reproduce it byte "
                    f"for byte; refresh it (python -m tpfix.maint.series refresh):\n"
                    f"{diff.stdout[-3000:]}"
                )
    print(f"{len(names)} patches apply exactly to {tag} and refresh to themselves")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "command",
        choices=[
            "setup",
            "push",
            "pop",
            "new",
            "add",
            "refresh",
            "check",
            "quilt",
            "top",
            "applied",
            "diff",
        ],
    )
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ap.add_argument("--line", help="release line (default: the top-level VERSION's)")
    a = ap.parse_args()
    line = get_line(a.line)
    if a.command == "setup":
        return setup(line)
    if a.command == "check":
        return check(line)
    args = a.args if a.command == "quilt" else [a.command, *a.args]
    sys.exit(quilt(*args, line=line))


if __name__ == "__main__":
    main_wrapper(main)
