# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Install the default line's vLLM common runtime requirements into this venv.

The scenario tests import the real vLLM from source trees (no compiled
parts), which needs requirements/common.txt of the pinned sdist.  Skipped when
the venv already holds them (stamp keyed by the sdist's sha256).
"""

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tpfix.fetch import fetch_sdist
from tpfix.lines import get_line, sdist_pin
from tpfix.util import main_wrapper


def main() -> None:
    stamp = Path(sys.prefix) / ".vllm-common-deps"
    tag = get_line().tag
    pin = sdist_pin(tag)
    if stamp.exists() and stamp.read_text() == pin.sha256:
        return
    sdist = fetch_sdist(tag)
    with tarfile.open(sdist) as tar, tempfile.TemporaryDirectory() as tmp:
        member = tar.getmember(f"vllm-{pin.version}/requirements/common.txt")
        req = Path(tmp) / "common.txt"
        req.write_bytes(tar.extractfile(member).read())
        print(f"installing {member.name} into {sys.prefix}", file=sys.stderr)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
                str(req),
            ],
            check=True,
        )
    stamp.write_text(pin.sha256)


if __name__ == "__main__":
    main_wrapper(main)
