# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A line's triage of known advisories: advisories.toml beside its series.

Read by tpfix.audit.advisories (the VEX analysis of each advisory found) and by
tpfix.release.wheel_sbom (an advisory a patch fixes is among that patch's `resolves`).
The format is in tpfix.audit.advisories' docstring and in the file itself.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

from tpfix.core.lines import Line
from tpfix.core.patch_format import read_series
from tpfix.core.util import Fail, shown

STATES = {
    "resolved",
    "resolved_with_pedigree",
    "exploitable",
    "in_triage",
    "false_positive",
    "not_affected",
}
JUSTIFICATIONS = {
    "code_not_present",
    "code_not_reachable",
    "protected_at_perimeter",
    "protected_at_runtime",
    "protected_by_compiler",
    "protected_by_mitigating_control",
    "requires_configuration",
    "requires_dependency",
    "requires_environment",
}


def triage_path(line: Line) -> Path:
    return line.series.parent / "advisories.toml"


def load_triage(line: Line, series: Iterable[str] | None = None) -> tuple[Path, dict[str, dict]]:
    """The line's advisories.toml, checked against its series (`series`: the
    patch names a build resolved already): {advisory id: entry}."""
    path = triage_path(line)
    if not path.exists():
        return path, {}
    try:
        entries = tomllib.loads(path.read_text()).get("advisory", [])
    except tomllib.TOMLDecodeError as e:
        raise Fail(f"{shown(path)}: not valid TOML: {e}") from None
    series = set(read_series(line.series) if series is None else series)
    out = {}
    for e in entries:
        where = f"{shown(path)}: {e.get('id', '(an entry without id)')}"
        if not e.get("id"):
            raise Fail(f"{where}: every [[advisory]] needs an `id`")
        if e.get("state") not in STATES:
            raise Fail(f"{where}: state must be one of {sorted(STATES)}")
        if e.get("justification") and e["justification"] not in JUSTIFICATIONS:
            raise Fail(f"{where}: justification must be one of {sorted(JUSTIFICATIONS)}")
        if e["state"] == "not_affected" and not e.get("justification"):
            raise Fail(f"{where}: not_affected needs a `justification`")
        if "patch" in e and (e["patch"] not in series or e["state"] != "resolved_with_pedigree"):
            raise Fail(
                f"{where}: `patch` must name a patch of the series, with state "
                "resolved_with_pedigree (the SBOM's pedigree holds the patch)"
            )
        out[e["id"]] = e
    return path, out
