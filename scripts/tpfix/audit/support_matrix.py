# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The versions table of the release lines, generated from their pins.

    python -m tpfix.audit.support_matrix            # print the markdown table
    python -m tpfix.audit.support_matrix --readme   # write it into README.md (between the markers)

One row per release line, the default first, then the others by version
(lines.line_names).  Every cell comes from the line's VERSION and pin file
(patches/<tag>/VERSION, patches/<tag>/pins.toml):

  tag               the vLLM tag
  flashinfer        the flashinfer-python== the official wheels require
  flashinfer-repinned   the one our wheel requires where the series re-pins it
                    (v0.27.1: patch 0001); absent: the official one, unchanged
  torch             the torch== the official wheels require
  cuda              CUDA of the official wheels
  requires-python   Requires-Python of the official wheels (ours keeps it)
  image-python      Python of the official image: PYTHON_VERSION of the
                    sdist's docker/Dockerfile, which the image is built from
  [[artifact]]      the official wheels, whose names (our version put in)
                    are our wheels' names

flashinfer, torch and requires-python are facts of the official wheels'
METADATA (wheel_facts reads them), image-python of the sdist (image_python);
maint/start_line.py writes all four for a new line, tests/test_support_matrix.py checks
them against the official files.  flashinfer-repinned is the series' fact: a
maintainer adds it with the patch that re-pins (the fast test checks it is
the version the series writes into requirements/cuda.txt).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tpfix.core.lines import (
    Line,
    get_line,
    image_tag,
    line_names,
    load_pins,
    read_pin_file,
    read_version,
)
from tpfix.core.util import ROOT, Fail, main_wrapper, sdist_text, shown
from tpfix.core.wheelfile import requirements, wheel_message

README = ROOT / "README.md"
BEGIN = "<!-- versions:begin -->"
END = "<!-- versions:end -->"
# the pin-file keys of the official wheels' METADATA (wheel_facts)
WHEEL_FACTS = ("requires-python", "torch", "flashinfer")
COLUMNS = ("line", "vLLM tag", "FlashInfer", "torch", "CUDA (official wheel)", "Python")
COLUMNS += ("wheel", "image")


def _exact_pin(requires: list[Requirement], project: str) -> str | None:
    """X of the unconditional `project==X` among Requires-Dist values."""
    for req in requires:
        specs = list(req.specifier)
        if (
            canonicalize_name(req.name) == project
            and req.marker is None
            and len(specs) == 1
            and specs[0].operator == "=="
        ):
            return specs[0].version
    return None


def wheel_facts(wheel: Path) -> dict[str, str]:
    """{"requires-python", "torch", "flashinfer"} of a wheel's METADATA."""
    meta = wheel_message(wheel)
    requires = requirements(meta, f"{shown(wheel)}: METADATA")
    facts = {
        "requires-python": meta.get("Requires-Python"),
        "torch": _exact_pin(requires, "torch"),
        "flashinfer": _exact_pin(requires, "flashinfer-python"),
    }
    missing = [k for k, v in facts.items() if not v]
    if missing:
        raise Fail(f"{shown(wheel)}: its METADATA names no {', '.join(missing)}")
    return {k: str(v).strip() for k, v in facts.items()}


def dockerfile_arg(sdist: Path, name: str) -> str | None:
    """The default of `ARG name=...` in the sdist's docker/Dockerfile (the one
    the official image is built from), or None where it has none."""
    text = sdist_text(sdist, "docker/Dockerfile")
    if text is None:
        return None
    m = re.search(rf"^ARG {re.escape(name)}=(\S+)\s*$", text, re.M)
    return m.group(1) if m else None


def image_python(sdist: Path) -> str | None:
    """The official image's Python (PYTHON_VERSION of docker/Dockerfile), or None."""
    version = dockerfile_arg(sdist, "PYTHON_VERSION")
    return version if version and re.fullmatch(r"\d+\.\d+", version) else None


def pin_facts(line: Line) -> dict:
    """The line's pin file, with every key the table needs checked."""
    data = read_pin_file(line.pins)
    for key in ("tag", "cuda", *WHEEL_FACTS):
        if not isinstance(data.get(key), str):
            raise Fail(
                f'{shown(line.pins)}: no `{key} = "..."`; read it from the official '
                "wheel's METADATA (python -m tpfix.audit.support_matrix documents the keys)"
            )
    return data


def python_range(spec: str) -> str:
    """3.10–3.14 for `<3.15,>=3.10`; the specifier itself when it is not a
    plain >=/< pair of minor versions."""
    ops = {s.operator: s.version for s in SpecifierSet(spec)}
    low, high = ops.get(">="), ops.get("<")
    if set(ops) == {">=", "<"} and re.fullmatch(r"3\.\d+", low) and re.fullmatch(r"3\.\d+", high):
        return f"{low}–3.{int(high.split('.')[1]) - 1}"
    return spec


def _braced(names: list[str]) -> str:
    """a-{x,y}.whl for a-x.whl and a-y.whl."""
    if len(names) < 2:
        return "".join(names)
    head = os.path.commonprefix(names)
    head = head[: max(head.rfind(c) for c in "-_.") + 1]  # whole words only
    tail = os.path.commonprefix([n[len(head) :][::-1] for n in names])[::-1]
    tail = tail[min((tail.find(c) for c in "-_." if c in tail), default=len(tail)) :]
    return head + "{" + ",".join(n[len(head) : len(n) - len(tail)] for n in names) + "}" + tail


def row(line: Line) -> list[str]:
    data = pin_facts(line)
    version = read_version(line.version_file)
    upstream = version.split("+")[0]
    official = data["flashinfer"]
    repinned = data.get("flashinfer-repinned")
    if repinned and repinned != official:
        flashinfer = f"{repinned} (re-pinned from {official})"
    else:
        flashinfer = f"{official} (upstream's pin, unchanged)"
    python = python_range(data["requires-python"])
    python += f" (image: {data['image-python']})" if data.get("image-python") else ""
    wheels = [
        a.filename.replace(f"{a.project}-{upstream}-", f"{a.project}-{version}-", 1)
        for a in load_pins(line.pins)
        if a.role == "wheel"
    ]
    folder = line.dist.relative_to(ROOT).as_posix()
    return [
        "default" if line.is_default else f"`--line {line.tag}`",
        data["tag"],
        flashinfer,
        data["torch"],
        data["cuda"],
        python,
        f"`{folder}/{_braced(wheels)}`",
        f"`{image_tag(version)}` on `{line.official_image}`",
    ]


def table(names: list[str] | None = None) -> str:
    """The markdown table, one row per line (all of them by default)."""
    rows = [COLUMNS, ["---"] * len(COLUMNS)]
    rows += [row(get_line(n)) for n in (line_names() if names is None else names)]
    return "".join("| " + " | ".join(r) + " |\n" for r in rows)


def readme_block(text: str) -> str:
    """What README.md holds between the markers (the table, as printed)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise Fail(f"{shown(README)}: needs one {BEGIN} ... {END} block")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].removeprefix("\n")


def update_readme(path: Path = README) -> bool:
    """Write the table into the README block; True when it changed."""
    text = path.read_text()
    old = readme_block(text)
    if old == table():
        return False
    head, rest = text.split(BEGIN, 1)
    path.write_text(head + BEGIN + "\n" + table() + END + rest.split(END, 1)[1])
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--readme", action="store_true", help=f"write the table into {shown(README)} instead"
    )
    args = ap.parse_args()
    if args.readme:
        changed = update_readme()
        print(f"{shown(README)}: {'updated' if changed else 'already up to date'}")
    else:
        print(table(), end="")


if __name__ == "__main__":
    main_wrapper(main)
