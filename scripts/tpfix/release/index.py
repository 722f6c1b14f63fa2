# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A static PEP 503 simple index for the wheels of a dist folder.

    python -m tpfix.release.index dist            # every *.whl directly in dist/

For wheels lying in DIST it writes, and nothing else:

  DIST/<wheel>.metadata       the wheel's own .dist-info/METADATA, byte for
                              byte (PEP 658: pip resolves without downloading
                              the wheel)
  DIST/simple/index.html      the project list (href "./vllm/")
  DIST/simple/vllm/index.html one link per wheel: href "../../<wheel>#sha256=
                              <hex>", data-requires-python (its METADATA's
                              Requires-Python), and the sha256 of <wheel>.
                              metadata as data-core-metadata (PEP 714) and as
                              data-dist-info-metadata (PEP 658, older pips)

Every href is relative, so any static web server that publishes DIST serves
the index: pip install --index-url https://HOST/PATH-OF-DIST/simple vllm.

The pages come from simple503's page generators (generate_index,
generate_project_page, WheelFile).  Its make_simple() cannot make this layout:
it writes the pages into the folder it moves (or copies) the wheels to, so
the pages would land in DIST/ (target=DIST) or the wheels would be copied
into DIST/simple/ (target=DIST/simple); it also takes every wheel under its
origin, subfolders included (dist/<tag>/ holds another line's wheels), writes
METADATA re-encoded as text, and emits no data-core-metadata.  So the
metadata files are written here from the wheel's bytes, and the one missing
attribute is added to the anchor simple503 writes.

Same wheels, same bytes: the pages hold no time stamp and list the wheels by
name.  Each file is written to a temporary file beside it and moved into
place (os.replace), so a reader never sees half a page; a <wheel>.metadata
whose wheel is no longer in DIST is removed.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from packaging.utils import canonicalize_name
from simple503 import WheelFile, generate_index, generate_project_page

from tpfix.core.util import Fail, main_wrapper, shown, write_atomic
from tpfix.core.wheelfile import parse_metadata, wheel_metadata


def _field(metadata: bytes, name: str) -> str | None:
    """One header field of a METADATA (an email header block, as pip reads it)."""
    value = parse_metadata(metadata.decode("utf-8")).get(name)
    return None if value is None else str(value).strip()


class _CoreMetadata:
    """The page simple503's WheelFile.as_anchor writes to, passing its anchor
    through with PEP 714's data-core-metadata beside data-dist-info-metadata."""

    def __init__(self, page):
        self._page = page

    def a(self, **attrs):
        if "data-dist-info-metadata" in attrs:
            attrs["data-core-metadata"] = attrs["data-dist-info-metadata"]
        return self._page.a(**attrs)

    def __getattr__(self, name):
        return getattr(self._page, name)

    def __call__(self, *args, **kw):
        return self._page(*args, **kw)


class _Wheel(WheelFile):
    def as_anchor(self, page, base_url="/") -> None:
        super().as_anchor(_CoreMetadata(page), base_url)


def _page(airium) -> bytes:
    text = str(airium)
    return (text if text.endswith("\n") else text + "\n").encode()


def write_index(dist: Path, wheels: list[Path]) -> list[Path]:
    """Write the simple index of `wheels` (each lying directly in `dist`) and
    their .metadata files; return the files written, relative to `dist`."""
    dist = Path(dist)
    if not wheels:
        raise Fail(f"{shown(dist)}: no wheels to index")
    projects: dict[str, list[WheelFile]] = {}
    metadata: dict[Path, bytes] = {}
    for wheel in sorted({Path(w) for w in wheels}, key=lambda w: w.name):
        if wheel.suffix != ".whl" or not wheel.is_file():
            raise Fail(f"{shown(wheel)}: no such wheel")
        if wheel.resolve().parent != dist.resolve():
            raise Fail(f"{shown(wheel)}: not in {shown(dist)} (the index links ../../<wheel>)")
        meta = wheel_metadata(wheel)
        name = _field(meta, "Name")
        if not name:
            raise Fail(f"{shown(wheel)}: its METADATA has no Name")
        metadata[Path(f"{wheel.name}.metadata")] = meta
        with open(wheel, "rb") as f:
            wheel_hash = hashlib.file_digest(f, "sha256")
        projects.setdefault(canonicalize_name(name), []).append(
            _Wheel(
                filename=wheel.name,
                wheel_hash=wheel_hash,
                requires_python=_field(meta, "Requires-Python"),
                metadata_hash=hashlib.sha256(meta),
            )
        )
    pages = {Path("simple/index.html"): _page(generate_index(sorted(projects), base_url="./"))}
    for project, files in sorted(projects.items()):
        page = generate_project_page(project, files, base_url="../../")
        pages[Path("simple", project, "index.html")] = _page(page)
    written = [*metadata, *pages]
    for rel, data in {**metadata, **pages}.items():
        write_atomic(dist / rel, data)
    for stale in dist.glob("*.whl.metadata"):
        if not stale.with_suffix("").exists():
            stale.unlink()
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dist", type=Path, help="the folder holding the wheels (e.g. dist)")
    args = ap.parse_args()
    wheels = sorted(args.dist.glob("*.whl"))
    for rel in write_index(args.dist, wheels):
        print(args.dist / rel)


if __name__ == "__main__":
    main_wrapper(main)
