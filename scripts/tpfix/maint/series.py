# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Maintainer workflow for the quilt series in patches/.

    scripts/tpfix/maint/series.py setup            # build/dev/vllm: pristine tree bound to patches/
    scripts/tpfix/maint/series.py push [NAME|-a]   # apply the next patch / up to NAME / all
    scripts/tpfix/maint/series.py pop [-a]         # unapply
    scripts/tpfix/maint/series.py new NAME.patch   # start a patch after the current top
    scripts/tpfix/maint/series.py add FILE...      # record files before editing them
    scripts/tpfix/maint/series.py refresh          # write the top patch back (canonical format)
    scripts/tpfix/maint/series.py check            # series applies exactly; refresh is a no-op
    scripts/tpfix/maint/series.py quilt ARGS...    # any other quilt command, same settings

All commands run quilt in build/dev/vllm with QUILT_PATCHES=patches/, so a
refresh edits the files in this repository: review them with git diff.  quilt
runs through tpfix.quilt: every push is exact (--fuzz=0) and every refresh
uses the same canonical options (quilt.REFRESH_ARGS), which is what makes
`check` able to demand byte-for-byte reproduction; patch headers (the text
above the first diff, patchfile) are kept by quilt.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from tpfix.common import PATCHES, ROOT, SERIES, Fail, main_wrapper, run
from tpfix.patch import prepare_tree
from tpfix.patchfile import read_series
from tpfix.quilt import Quilt, require

DEV = ROOT / "build" / "dev" / "vllm"


def quilt(*args: str, tree: Path = DEV, patches: Path = PATCHES, series: Path = SERIES) -> int:
    """Run `quilt ARGS` in `tree` on the terminal: push exact, refresh canonical."""
    require()
    if not tree.exists():
        raise Fail(f"{tree} does not exist; run: scripts/tpfix/maint/series.py setup")
    return Quilt(tree, patches, series).interactive(*args)


def setup() -> None:
    if DEV.exists():
        raise Fail(f"{DEV} exists; remove it first (rm -rf {DEV})")
    prepare_tree(DEV, upto="", keep_quilt_state=True)
    print(f"{DEV}: pristine; `scripts/tpfix/maint/series.py push -a` applies the series")


def check(patches: Path = PATCHES, series: Path = SERIES) -> None:
    """Each patch applies exactly in order, and refreshing it changes no byte."""
    names = read_series(series)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "patches"
        shutil.copytree(patches, copy)
        tree = prepare_tree(Path(tmp) / "vllm", upto="")
        q = Quilt(tree, copy, copy / series.name)
        for name in names:
            q.push_exact(name)
            q.refresh(f"patches/{name}")
            if not filecmp.cmp(patches / name, copy / name, shallow=False):
                diff = run(["diff", "-u", str(patches / name), str(copy / name)])
                raise Fail(
                    f"patches/{name}: `quilt refresh` does not reproduce it byte for "
                    f"byte; run scripts/tpfix/maint/series.py refresh on it:\n{diff.stdout[-3000:]}"
                )
    print(f"{len(names)} patches apply exactly and refresh to themselves")


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
    a = ap.parse_args()
    if a.command == "setup":
        return setup()
    if a.command == "check":
        return check()
    args = a.args if a.command == "quilt" else [a.command, *a.args]
    sys.exit(quilt(*args))


if __name__ == "__main__":
    main_wrapper(main)
