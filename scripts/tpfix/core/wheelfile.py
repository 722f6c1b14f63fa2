# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The one reader of a wheel's files: its METADATA (bytes, or parsed as pip
reads it), its Requires-Dist as packaging Requirements, and the arch its file
name's platform tag names.

(tpfix.image.image_inside runs inside the image build with the standard library
only, so it keeps its own small reader.)"""

from __future__ import annotations

import re
from email.message import Message
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from tpfix.core.util import Fail, shown


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


def parse_metadata(text: str) -> Message:
    """METADATA text parsed (an email.message.Message, as pip reads it)."""
    return Parser().parsestr(text)


def wheel_message(wheel: Path) -> Message:
    """The wheel's METADATA parsed (parse_metadata)."""
    return parse_metadata(wheel_metadata(wheel).decode("utf-8"))


def requirements(meta: Message, where: str = "METADATA") -> list[Requirement]:
    """The Requires-Dist values of a parsed METADATA, in order, as Requirements
    (compare names with packaging.utils.canonicalize_name); `where` names the
    file in the error for a value that is no valid requirement."""
    out = []
    for text in meta.get_all("Requires-Dist") or []:
        try:
            out.append(Requirement(text))
        except InvalidRequirement as e:
            why = str(e).splitlines()[0]
            raise Fail(
                f"{where}: Requires-Dist {text!r} is not a valid requirement ({why})"
            ) from None
    return out


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist as Requirements (requirements)."""
    return requirements(wheel_message(wheel), f"{shown(wheel)}: METADATA")
