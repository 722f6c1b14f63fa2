# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Stage 5: publish a verified wheel into dist/ with its SHA256SUMS.

The wheel is staged next to dist/ and moved in with os.replace (atomic on one
file system), then SHA256SUMS is written the same way; older vllm wheels in
dist/ are removed only after that.  An interrupted run leaves dist/ as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tpfix.common import sha256_file


def publish(wheel: Path, dist: Path) -> Path:
    dist.mkdir(parents=True, exist_ok=True)
    final = dist / wheel.name
    digest = sha256_file(wheel)
    os.replace(wheel, final)
    fd, tmp = tempfile.mkstemp(prefix=".SHA256SUMS.", dir=dist)
    with os.fdopen(fd, "w") as f:
        f.write(f"{digest}  {final.name}\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, dist / "SHA256SUMS")
    for old in dist.glob("vllm-*.whl"):
        if old.name != final.name:
            old.unlink()
    return final
