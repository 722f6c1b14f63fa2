# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Tiny stand-in wheels for the tests of the index, the package stage, the
SBOMs and the advisories: a real wheel file, a few hundred bytes."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

VERSION = "0.0.1+tpfix.1"
REQUIRES_PYTHON = ">=3.10,<3.15"


def make_wheel(
    folder: Path,
    version: str = VERSION,
    name: str = "vllm",
    requires: tuple[str, ...] = ("flashinfer-python==0.6.16.post4",),
    fields: tuple[str, ...] = (),
) -> Path:
    """A minimal pure-Python wheel (METADATA, WHEEL, RECORD), of project vllm by
    default; `fields` are more METADATA lines ("License-Expression: MIT")."""
    dist_info = f"{name}-{version}.dist-info"
    reqs = "".join(f"Requires-Dist: {r}\n" for r in requires) + "".join(f"{f}\n" for f in fields)
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\n"
            f"Version: {version}\nRequires-Python: {REQUIRES_PYTHON}\n"
            f"{reqs}\ntest wheel\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"  # noqa: E501
        for path, data in files.items()
    )
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), data)
    return wheel


def simple_index(root: Path, wheels: list[Path]) -> Path:
    """root/simple: a PEP 503 index of `wheels` (copied in), one page per
    project with each file's sha256, as a package index serves them."""
    simple = root / "simple"
    for whl in wheels:
        page = simple / whl.name.split("-")[0].replace("_", "-")
        page.mkdir(parents=True, exist_ok=True)
        (page / whl.name).write_bytes(whl.read_bytes())
    for page in simple.iterdir():
        links = "".join(
            f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
            for w in sorted(page.glob("*.whl"))
        )
        (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return simple
