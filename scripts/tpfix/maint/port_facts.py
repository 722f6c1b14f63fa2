# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""What porting a line's series onto its tag showed, and what each port must
keep: data in patches/<tag>/port.toml, beside rebase.json (the line it was
started from, each patch's class).  tests/test_upstream_port.py checks a
line's facts against a fresh rebase report and its ported series, for every
line start_line made; a line without them fails, it is not skipped.
tpfix.maint.start_line writes what the report recorded (below: "recorded"),
the maintainer who ports the conflicts adds the reasons and the key lines.

    [report."<patch of the source series>"]     what the rebase showed
    why = "..."                 why it got its class (required)
    after_uncarried = [...]     the conflicting patches it builds on (recorded)
    conflicts = [...]           files with a diff3 merge to resolve (recorded)
    upstream_side = {file = ["text", ...]}    what the tag's side of a conflict holds
    ported_as = [...]           not carried by name: the line's own (`new`) patches
                                that carry it in another shape ([]: dropped, `why` says why)
    [[report."<patch>".checks]]  each `Scenario:` check, in order (recorded)
    spec = "bug_a:warm_start"   kwargs = {...}
    target = false              passed on the tag
    pinned_before = false       passed on the source tag before the patch (absent:
                                not run, for a check red on the tag)
    result = {...}              what the tag's result holds (a subset, exact values)
    contains = {"a.b" = "text"} text that the result's string at a.b contains

    [port."<patch of the line's series>"]       what the port keeps
    why = "..."                 (required)
    new = true                  a patch of this line only, not carried from the source
    fixes = [...]               what its pull request fixes: #N (Bug:), issue-<id>
    adds = {file = ["text"]}    text that some added line of its diff of file holds
    removes = {file = ["text"]} the same for removed lines
    kept_upstream = ["text"]    text that no port of the series removes (upstream's)
    tree_lacks = {file = ["text"]}     not in the ported tree's file
    tree_order = {file = ["a", "b"]}   in the ported file, each after the one before
    multi_gpu_tests = [...]     tests it marks for upstream's multi-GPU CI
    [[port."<patch>".green]]    scenarios green on trees of the tag
    spec = "..."  on = ["pristine", "port"]  result = {...}
    [port."<patch>".red_green."<spec>"]  its `Scenario:` check, red before and green with it
    before = {...}  after = {...}  before_contains = {...}  after_contains = {...}
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from tpfix.core.lines import Line, get_line
from tpfix.core.patch_format import read_patch, read_series
from tpfix.core.util import Fail, shown

FILE = "port.toml"
REPORT_KEYS = {"why", "after_uncarried", "conflicts", "upstream_side", "checks", "ported_as"}
CHECK_KEYS = {"spec", "kwargs", "target", "pinned_before", "result", "contains"}
PORT_KEYS = {
    "why",
    "new",
    "fixes",
    "adds",
    "removes",
    "kept_upstream",
    "tree_lacks",
    "tree_order",
    "multi_gpu_tests",
    "green",
    "red_green",
}


def _unknown(where: str, table: dict, known: set[str]) -> None:
    if extra := sorted(set(table) - known):
        raise Fail(f"{where}: unknown keys {extra} (known: {sorted(known)})")


def load(line: Line) -> dict[str, Any]:
    """The port facts of `line` (started from another line: it has a
    rebase.json), checked: one [report] entry for every patch of the source
    series, one [port] entry for every patch of the line's series, each with
    its `why`, and no unknown key.  Fail names the file and what is missing."""
    path = line.patches / FILE
    rebase = json.loads((line.patches / "rebase.json").read_text())
    if not path.exists():
        raise Fail(
            f"{shown(path)} is missing: the facts of the port from {rebase['from']} "
            "(tpfix.maint.start_line writes it; see tpfix/maint/port_facts.py)"
        )
    try:
        facts = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise Fail(f"{shown(path)}: not valid TOML: {e}") from None
    _unknown(shown(path), facts, {"report", "port"})
    wanted = {
        "report": list(rebase["patches"]),
        "port": read_series(line.series),
    }
    keys = {"report": REPORT_KEYS, "port": PORT_KEYS}
    for part, names in wanted.items():
        table = facts.get(part, {})
        if missing := [n for n in names if n not in table]:
            raise Fail(f"{shown(path)}: no [{part}] entry for {missing}")
        if extra := sorted(set(table) - set(names)):
            raise Fail(f"{shown(path)}: [{part}] entries for no such patch: {extra}")
        for name in names:
            where = f"{shown(path)} [{part}.{name!r}]"
            _unknown(where, table[name], keys[part])
            if not str(table[name].get("why", "")).strip():
                raise Fail(f"{where}: no `why`: say why, for the next maintainer")
            need = {"fixes"} if part == "port" else set()
            if part == "report" and rebase["patches"][name] == "conflicts":
                need = {"after_uncarried", "conflicts"}
            if lack := sorted(need - set(table[name])):
                raise Fail(f"{where}: no {lack}")
            for check in table[name].get("checks", []):
                _unknown(where + " checks", check, CHECK_KEYS)
    new = new_patches(facts)
    for name, report in facts["report"].items():
        if stray := [n for n in report.get("ported_as", []) if n not in new]:
            raise Fail(
                f"{shown(path)} [report.{name!r}]: ported_as names {stray}, "
                "not a patch of the line's series marked `new = true` in [port]"
            )
    return facts


def new_patches(facts: dict[str, Any]) -> list[str]:
    """The line's own patches (`new = true` in [port]), in port.toml's order."""
    return [n for n, port in facts.get("port", {}).items() if port.get("new")]


def carried_by_name(facts: dict[str, Any], classes: dict[str, str]) -> list[str]:
    """The source patches a line carries under their own names, in order: those
    rebase.json (`classes`) does not find absorbed and port.toml's report does
    not say are carried in another shape or dropped (`ported_as`)."""
    report = facts.get("report", {})
    return [
        n for n, c in classes.items() if c != "absorbed" and "ported_as" not in report.get(n, {})
    ]


def mismatches(actual: Any, expected: Any, contains: dict[str, str] | None = None) -> list[str]:
    """Where `actual` differs from `expected`, a subset of it (dicts by key,
    everything else exactly), and each dotted path of `contains` does not
    hold its text; [] when it agrees."""
    out = _subset(actual, expected, "")
    for dotted, text in (contains or {}).items():
        value: Any = actual
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, str) or text not in value:
            out.append(f"{dotted}: {value!r} does not contain {text!r}")
    return out


def _subset(actual: Any, expected: Any, at: str) -> list[str]:
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{at or '.'}: {actual!r} is not a table"]
        out = []
        for key, value in expected.items():
            where = f"{at}.{key}" if at else key
            if key not in actual:
                out.append(f"{where}: missing")
            else:
                out += _subset(actual[key], value, where)
        return out
    if actual != expected or type(actual) is not type(expected):
        return [f"{at or '.'}: {actual!r} != {expected!r}"]
    return []


def _value(v: Any) -> str:
    """TOML for the scalars, lists and tables start_line records."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot record {v!r}")


def record(report: dict, carried: list[str], new: list[str] = ()) -> str:
    """port.toml as start_line writes it from a rebase report: what the
    report recorded for each patch, `why` left for the maintainer (load()
    refuses it empty), a [port] entry for each carried patch, and one for
    each `new` patch start_line wrote itself (a --repin: its why said)."""
    source = get_line(report["from"])
    out = [
        f"# The port of the {report['from']} line's series onto {report['to']}: what",
        "# the rebase showed and what each port keeps (tpfix/maint/port_facts.py).",
        "# Recorded by tpfix.maint.start_line; write each `why`, and a [port] entry",
        "# for each conflicting patch you port.",
    ]
    for rec in report["patches"]:
        out += ["", f"[report.{json.dumps(rec['name'])}]", f'why = ""  # {rec["status"]}']
        if rec["status"] == "conflicts":
            out.append(f"after_uncarried = {_value(list(rec['after_uncarried']))}")
            out.append(f"conflicts = {_value(sorted(rec['merge_conflicts']))}")
        for check in rec.get("checks", []):
            out += ["", f"[[report.{json.dumps(rec['name'])}.checks]]"]
            out.append(f"spec = {_value(check['spec'])}")
            if check.get("kwargs"):
                out.append(f"kwargs = {_value(check['kwargs'])}")
            for key in ("target", "pinned_before"):
                if key not in check:
                    continue
                if check[key]["passed"] is None:  # the check could not run there
                    error = (check[key].get("error") or "no result").strip().splitlines()
                    out.append(f"# {key}: undecided, the check did not run: {error[-1][:160]}")
                else:
                    out.append(f"{key} = {_value(check[key]['passed'])}")
    for name in new:
        out += ["", f"[port.{json.dumps(name)}]", "new = true", "fixes = []"]
        out.append('why = "re-pin: the package index does not serve upstream\'s pin"')
    for name in carried:
        out += ["", f"[port.{json.dumps(name)}]", 'why = ""']
        out.append(f"fixes = {_value(fixes(source.patches / name))}")
    return "\n".join(out) + "\n"


def fixes(patchfile: Path) -> list[str]:
    """What a patch's pull request says it fixes: #N of the vLLM issue of its
    `Bug:` field, and issue-<id> for each `Issue: <id>` (an upstream issue
    the export writes, to be filed first)."""
    header = read_patch(patchfile).header
    bug = header.get("Bug") or ""
    m = re.fullmatch(r"https://github\.com/vllm-project/vllm/issues/(\d+)", bug)
    return ([f"#{m.group(1)}"] if m else []) + [f"issue-{i}" for i in header.get_all("Issue")]
