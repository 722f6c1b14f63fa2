# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""quilt, wrapped once: its environment, the exact push, the canonical refresh.

Every quilt run of the tooling goes through `Quilt(tree, patches, series)`:

* the environment names the series explicitly (QUILT_PATCHES, QUILT_SERIES)
  and ignores the user's ~/.quiltrc and QUILT_PUSH_ARGS (QUILTRC=-), so a
  run does not depend on who runs it;
* `push_exact(*names)` applies patches exactly: --fuzz=0, and a hunk that
  applies only at an offset fails too; the error names the patch, the tag,
  the file and the failed hunks, and says how to fix it;
* `refresh()` writes the top patch back with the one canonical set of
  options, REFRESH_ARGS (no timestamps, no Index: lines, a/ b/ prefixes,
  files sorted), which is what lets maint.series check demand that a
  refresh reproduces each patch byte for byte; the header is kept;
* `q(*args)` runs any other quilt command (captured), `q.interactive(*args)`
  one whose output goes to the terminal, with push and refresh made exact
  and canonical as above.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tpfix.core.util import Fail, child_options, run, shown

REFRESH_ARGS = ["--no-timestamps", "--no-index", "-p", "ab", "--sort"]
PUSH_ARGS = ["--fuzz=0"]
# A hunk patch placed elsewhere than its header says, or only with fuzz.
OFFSET = re.compile(r"^Hunk #\d+ succeeded at \d+ (\(offset|with fuzz).*$", re.M)


def require() -> str:
    """The quilt executable, or a Fail that says how to install it."""
    path = shutil.which("quilt")
    if not path:
        raise Fail("`quilt` not found on PATH; install it (Debian: apt-get install quilt)")
    return path


def quilt_env(patches: Path, series: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(QUILT_PATCHES=str(patches), QUILT_SERIES=str(series), QUILTRC="-")
    env.pop("QUILT_PUSH_ARGS", None)
    return env


def offsets(out: str) -> list[str]:
    """The "Hunk #n succeeded at ... (offset/with fuzz)" lines of quilt's output."""
    return [m.group(0).strip() for m in OFFSET.finditer(out)]


def canonical(args: tuple[str, ...] | list[str]) -> list[str]:
    """`args` of a quilt command with this distribution's options: push
    exact (PUSH_ARGS), refresh canonical (REFRESH_ARGS)."""
    if not args:
        return []
    extra = {"push": PUSH_ARGS, "refresh": REFRESH_ARGS}.get(args[0], [])
    return [args[0], *extra, *args[1:]]


class Quilt:
    """quilt in `tree` for the series file `series` (default `patches`/series)."""

    def __init__(self, tree: Path, patches: Path, series: Path | None = None):
        self.tree, self.patches = tree, patches
        self.series = series if series is not None else patches / "series"
        self.env = quilt_env(self.patches, self.series)

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        """`quilt ARGS` as given, output captured."""
        return run(["quilt", *args], cwd=self.tree, env=self.env, input=stdin)

    def interactive(self, *args: str) -> int:
        """`quilt ARGS` (push exact, refresh canonical) on the terminal; its status."""
        require()
        cmd = ["quilt", *canonical(args)]
        return subprocess.run(cmd, cwd=self.tree, env=self.env, **child_options()).returncode

    def push_exact(self, *names: str, tag: str) -> None:
        """Push `names` in order (the next ones of the series), exactly; Fail
        naming the patch on a conflict, an offset or fuzz (`tag`: the tree's)."""
        require()
        for name in names:
            if not (self.patches / name).exists():
                raise Fail(f"{self.series}: lists {name}, but {self.patches / name} does not exist")
            proc = self("push", *PUSH_ARGS, name)
            out = proc.stdout + proc.stderr
            if proc.returncode != 0:
                raise Fail(_explain(self.patches / name, out, tag))
            if m := OFFSET.search(out):
                file = _file_of(out, m.start())
                raise Fail(
                    f"{shown(self.patches / name)}: applies only with an offset/fuzz in {file} "
                    f"({m.group(0).strip()}); refresh it: python -m tpfix.maint.series refresh"
                )

    def refresh(self, what: str | None = None) -> None:
        """Refresh the top patch with REFRESH_ARGS; Fail naming `what` if quilt fails."""
        proc = self("refresh", *REFRESH_ARGS)
        if proc.returncode != 0:
            err = proc.stderr.strip()
            if what:
                raise Fail(f"{what}: quilt refresh failed: {err}")
            raise Fail(f"quilt refresh failed in {self.tree}: {err}")


def _file_of(out: str, pos: int) -> str:
    files = re.findall(r"^patching file (\S+)", out[:pos], re.M)
    return files[-1] if files else "?"


def _explain(patch: Path, out: str, tag: str) -> str:
    failed = re.findall(r"^(?:Hunk #\d+ FAILED.*|\S.*FAILED.*)$", out, re.M)
    files = re.findall(r"^patching file (\S+)", out, re.M)
    missing = re.findall(r"can't find file to patch.*|No file to patch.*", out)
    where = files[-1] if files else "?"
    detail = "; ".join(failed[:3] + missing[:1]) or "".join(out.strip().splitlines()[-1:])
    return (
        f"{shown(patch)} does not apply to {tag} (file {where}): {detail}. "
        "Nothing was left half-patched. Rebase it: "
        f"python -m tpfix.maint.series --line {tag} push, fix, refresh"
    )
