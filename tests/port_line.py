# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The newest release line, the forward port that goes upstream, as its data
says: its folder of patches/, the source line its rebase.json names, its
series and port.toml facts.  Shared by test_upstream_port.py and
test_upstream_export.py (import it only where a second line exists).
"""

from __future__ import annotations

import json
from pathlib import Path

from tpfix.core.lines import get_line, newest_line
from tpfix.core.patch_format import read_patch, read_series
from tpfix.maint.export import mailed
from tpfix.maint.port_facts import fixes
from tpfix.maint.port_facts import load as load_facts
from tpfix.stages.patch import cached_tree

TAG = newest_line()  # the newest line: what goes upstream (maint.export's default)
PORT = get_line(TAG).patches
SERIES = PORT / "series"
# the committed classification (python -m tpfix.maint.start_line writes it)
COMMITTED = json.loads((PORT / "rebase.json").read_text())
FROM = COMMITTED["from"]  # the source line, the one whose series moved to TAG
PATCHES = get_line(FROM).patches
SOURCE = read_series(get_line(FROM).series)
PORTED = read_series(SERIES)
# the ones the export mails (not the `Forwarded: not-needed` ones)
MAILED = mailed(SERIES)
GPU_SKIP = "Need at least 2 GPUs"
SIGNOFF = "Export Tester <export-tester@users.noreply.github.com>"


def origin(name: str) -> Path:
    """The folder of the patch a port comes from: the source line's, or for a
    patch of this line only (`new` in port.toml), this line's."""
    return PORT if FACTS["port"].get(name, {}).get("new") else PATCHES


def scenarios(name: str) -> list[str]:
    """module:function of each `Scenario:` field of the patch NAME comes from."""
    header = read_patch(origin(name) / name).header
    return [v.split()[0].split("(")[0] for v in header.get_all("Scenario")]


FACTS = load_facts(get_line(TAG))  # patches/<tag>/port.toml
NEW = [n for n in PORTED if FACTS["port"][n].get("new")]  # this line's own patches
# what each port's pull request fixes, from the header of the patch it comes from
FIXES = {n: fixes(origin(n) / n) for n in PORTED}


def port_tree(upto: str | None = None) -> Path:
    return cached_tree(get_line(TAG), upto)
