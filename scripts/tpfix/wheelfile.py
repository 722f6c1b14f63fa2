# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The one reader of a wheel's files: its METADATA (bytes, or parsed as pip
reads it), its Requires-Dist as packaging Requirements, and the arch its file
name's platform tag names.

(tpfix.image_inside runs inside the image build with the standard library
only, so it keeps its own small reader.)"""

from __future__ import annotations

import re
from pathlib import Path

from tpfix.util import Fail, shown


def wheel_arch(wheel: Path) -> str:
    """The official arch a wheel of ours is for (its platform tag)."""
    return "aarch64" if wheel.name.endswith("_aarch64.whl") else "x86_64"


_METADATA = re.compile(r"^[^/]+\.dist-info/METADATA$")


def wheel_metadata(wheel: Path) -> bytes:
    """The bytes of the wheel's one top-level .dist-info/METADATA."""
    import zipfile

    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if _METADATA.match(n)]
            if len(names) != 1:
                raise Fail(f"{shown(wheel)}: {len(names)} .dist-info/METADATA files, not one")
            return z.read(names[0])
    except zipfile.BadZipFile as e:
        raise Fail(f"{shown(wheel)}: not a wheel ({e})") from None


def wheel_message(wheel: Path):
    """The wheel's METADATA parsed (an email.message.Message, as pip reads it)."""
    from email.parser import Parser

    return Parser().parsestr(wheel_metadata(wheel).decode("utf-8"))
