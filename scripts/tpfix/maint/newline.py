# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Prepare the release line of a new upstream tag: pins, carried series, VERSION.

    python -m tpfix.maint.newline v0.34.0                 # from the newest line
    python -m tpfix.maint.newline v0.34.0 --from v0.27.1  # from another line
    python -m tpfix.maint.newline v0.34.0 --no-checks     # textual classification only

For a tag with no line yet it writes lines/TAG/:

  pins.toml    the sdist and the official x86_64 and aarch64 wheels, pinned
               by the sha256 and size of the files pip downloaded (fetch.
               pin_release; `cuda` read from the wheel's METADATA extras).
               Review them before committing: a pin is a reviewed fact.
  series       the source line's series as rebase.py carries it onto TAG:
               absorbed patches dropped, patches that apply exactly or with
               changes (refreshed) carried; conflicting patches are left out
               and listed, their diff3 merges in lines/TAG/conflicts/ for a
               maintainer to port (then add them to the series, delete
               conflicts/, and bump VERSION).
  VERSION      <TAG>+tpfix.<number of carried patches>
  rebase.json  the classification it was made from: {patch: status}

Nothing is written when the line already exists, or when a step fails (the
folder is assembled beside lines/ and renamed into place).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from tpfix.common import LABEL, LINES, Fail, Line, get_line, line_names, main_wrapper, shown
from tpfix.fetch import pin_release
from tpfix.maint.rebase import format_table, rebase


def _toml_pins(tag: str, arts, cuda: str) -> str:
    out = [
        f"# Upstream artifacts of vLLM {tag}: sha256 and size of the files pip",
        "# downloaded (python -m tpfix.maint.newline).  Review before commit: a",
        "# hash here is a reviewed fact about the release; never edit one to make",
        "# a run pass.",
        "",
        f'tag = "{tag}"',
        "# CUDA of the official wheels (from the extras their METADATA keeps)",
        f'cuda = "{cuda}"',
    ]
    for a in arts:
        out += ["", "[[artifact]]", f'project = "{a.project}"', f'version = "{a.version}"']
        out += [f'role = "{a.role}"']
        if a.arch:
            out += [f'arch = "{a.arch}"', f'platform = "{a.platform}"']
        out += [f'filename = "{a.filename}"', f"size = {a.size}", f'sha256 = "{a.sha256}"']
    return "\n".join(out) + "\n"


def wheel_cuda(wheel: Path, fallback: str) -> str:
    """13.0 when the official wheel's requirements carry [cu13] extras (12.9 for
    [cu12]); `fallback` (the source line's) when they name neither."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    if re.search(r"^Requires-Dist: \S+\[cu13\]", text, re.M):
        return "13.0"
    if re.search(r"^Requires-Dist: \S+\[cu12\]", text, re.M):
        return "12.9"
    return fallback


def new_line(tag: str, source: Line, checks: bool = True) -> tuple[Path, dict]:
    """Write lines/TAG/ from `source`'s series (see the module docstring)."""
    if not re.fullmatch(r"v\d+\.\d+\.\d+", tag):
        raise Fail(f"{tag!r} is not a release tag like v0.34.0")
    dest = LINES / tag
    if dest.exists() or tag in line_names():
        raise Fail(f"{shown(dest)} exists: the line is already there")
    LINES.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tag}.", dir=LINES))
    try:
        arts = pin_release("vllm", tag[1:])
        from tpfix.fetch import cached_path

        wheel = next(a for a in arts if a.arch == "x86_64")
        cuda = wheel_cuda(cached_path(wheel), source.official_cuda())
        (tmp / "pins.toml").write_text(_toml_pins(tag, arts, cuda))
        # rebase looks the pins up as lines/TAG/pins.toml: expose them while it runs
        os.replace(tmp, dest)
        try:
            report = rebase(
                tag,
                dest / ".rebase",
                series=source.series,
                patches=source.patches,
                checks=None if checks else {},
                from_tag=source.tag,
            )
        except BaseException:
            os.replace(dest, tmp)
            raise
        os.replace(dest, tmp)
        carried = report["carried"]
        for name in [*carried, "series"]:
            shutil.copyfile(tmp / ".rebase" / "patches" / name, tmp / name)
        if (tmp / ".rebase" / "conflicts").exists():
            shutil.copytree(tmp / ".rebase" / "conflicts", tmp / "conflicts")
        shutil.rmtree(tmp / ".rebase")
        summary = {
            "from": source.tag,
            "to": tag,
            "checks": checks,
            "patches": {r["name"]: r["status"] for r in report["patches"]},
        }
        (tmp / "rebase.json").write_text(json.dumps(summary, indent=2) + "\n")
        (tmp / "VERSION").write_text(f"{tag[1:]}+{LABEL}.{len(carried)}\n")
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, report


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("tag", help="the new upstream tag, e.g. v0.34.0")
    ap.add_argument(
        "--from",
        dest="source",
        choices=line_names(),
        default=line_names()[-1],
        help="the line whose series moves (default: the newest)",
    )
    ap.add_argument("--no-checks", action="store_true", help="skip the scenario checks")
    args = ap.parse_args()
    dest, report = new_line(args.tag, get_line(args.source), not args.no_checks)
    print(format_table(report))
    left = [r["name"] for r in report["patches"] if r["status"] == "conflicts"]
    print(f"\n{shown(dest)}: pins.toml (review the hashes), series, VERSION, rebase.json")
    if left:
        print(f"to port by hand (diff3 merges in {shown(dest / 'conflicts')}): " + ", ".join(left))


if __name__ == "__main__":
    main_wrapper(main)
