# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""patches/<tag>/port.toml (tpfix.maint.port_facts): every line started from
another has its port facts, complete (tests/test_upstream_port.py checks
them against a fresh rebase and the ported series); what start_line records
loads back; a missing file, entry, `why` or an unknown key is refused naming
the file."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from tpfix.core.lines import Line, get_line, line_names
from tpfix.core.patch_format import read_series
from tpfix.core.util import Fail
from tpfix.maint.port_facts import FILE, fixes, load, mismatches, record

# every line start_line made (its rebase.json says from which line)
MADE = [t for t in line_names() if (get_line(t).patches / "rebase.json").exists()]


@pytest.mark.parametrize("tag", MADE)
def test_every_started_line_has_its_port_facts(tag: str):
    facts = load(get_line(tag))
    assert list(facts["report"]) == list(
        json.loads((get_line(tag).patches / "rebase.json").read_text())["patches"]
    )
    assert list(facts.get("port", {})) == read_series(get_line(tag).series)


def _line(tmp_path: Path, tag: str) -> Line:
    """A copy of line `tag`'s folder."""
    folder = tmp_path / tag
    shutil.copytree(get_line(tag).patches, folder)
    return Line.at(folder)


@pytest.mark.parametrize("tag", MADE)
def test_incomplete_facts_are_refused_naming_the_file(tmp_path: Path, tag: str):
    line = _line(tmp_path, tag)
    path = line.patches / FILE
    text = path.read_text()
    first = next(iter(json.loads((line.patches / "rebase.json").read_text())["patches"]))
    cases = {
        "no `why`": re.sub(r'(?s)why = (""".*?"""|"[^"\n]*")', 'why = " "', text, count=1),
        "entries for no such patch": text.replace(f'[report."{first}"]', '[report."0-x"]', 1),
        "unknown keys \\['whyy'\\]": text.replace("\nwhy = ", "\nwhyy = 1\nwhy = ", 1),
        "not valid TOML": text + "\n[report\n",
    }
    if "ported_as = [" in text:  # a misspelt or not-new patch name
        broken = re.sub(r"ported_as = \[", 'ported_as = ["0099-no-such.patch", ', text, count=1)
        cases["ported_as names \\['0099-no-such.patch'\\], not a patch"] = broken
    for message, broken in cases.items():
        path.write_text(broken)
        with pytest.raises(Fail, match=rf"{FILE}.*{message}"):
            load(line)
    path.write_text(text)
    rebase = json.loads((line.patches / "rebase.json").read_text())
    rebase["patches"]["0009-new.patch"] = "applies"
    (line.patches / "rebase.json").write_text(json.dumps(rebase))
    with pytest.raises(Fail, match=rf"{FILE}: no \[report\] entry for \['0009-new.patch'\]"):
        load(line)
    path.unlink()
    with pytest.raises(Fail, match=rf"{FILE} is missing: the facts of the port from v"):
        load(line)


def test_what_start_line_records_loads_once_each_why_is_written(tmp_path: Path):
    source = get_line(line_names()[0])
    names = read_series(source.series)
    report = {
        "from": source.tag,
        "to": "v9.9.9",
        "patches": [
            {"name": names[0], "status": "absorbed", "checks": []},
            {
                "name": names[1],
                "status": "conflicts",
                "after_uncarried": {names[0]: "x"},
                "merge_conflicts": {"vllm/b.py": 1, "vllm/a.py": 2},
                "checks": [
                    {
                        "spec": "bug_a:fused_ranges",
                        "kwargs": {"spec_method": "eagle3", "tp": 4},
                        "target": {"passed": False, "result": {}},
                    },
                    {
                        "spec": "bug_a:standalone",
                        "kwargs": {},
                        "target": {"passed": True, "result": {}},
                        "pinned_before": {"passed": False, "result": {}},
                    },
                ],
            },
            {"name": names[2], "status": "applies", "checks": []},
        ],
    }
    folder = tmp_path / "v9.9.9"
    folder.mkdir()
    classes = {r["name"]: r["status"] for r in report["patches"]}
    (folder / "rebase.json").write_text(json.dumps({"from": source.tag, "patches": classes}))
    (folder / "series").write_text(names[2] + "\n")
    (folder / "VERSION").write_text("9.9.9+tpfix.1\n")
    text = record(report, [names[2]])
    (folder / FILE).write_text(text)
    facts = tomllib.loads(text)
    conflict = facts["report"][names[1]]
    assert conflict["after_uncarried"] == [names[0]]
    assert conflict["conflicts"] == ["vllm/a.py", "vllm/b.py"]
    assert conflict["checks"] == [
        {"spec": "bug_a:fused_ranges", "kwargs": {"spec_method": "eagle3", "tp": 4}}
        | {"target": False},
        {"spec": "bug_a:standalone", "target": True, "pinned_before": False},
    ]
    assert "after_uncarried" not in facts["report"][names[0]]
    assert facts["port"] == {names[2]: {"why": "", "fixes": fixes(source.patches / names[2])}}
    with pytest.raises(Fail, match=rf"\[report.'{names[0]}'\]: no `why`"):
        load(Line.at(folder))
    (folder / FILE).write_text(text.replace('why = ""', 'why = "written"'))
    assert load(Line.at(folder))["report"][names[0]]["why"] == "written"


def test_mismatches():
    got = {"error": "ValueError", "message": "token_num (8192) exceeds", "models": {"t": 1, "d": 2}}
    assert mismatches(got, {"models": {"t": 1}}, {"message": "(8192)"}) == []
    assert mismatches(got, {"models": {"t": 2}}) == ["models.t: 1 != 2"]
    assert mismatches(got, {"models": {"x": 1}}) == ["models.x: missing"]
    assert mismatches(got, {"error": {"a": 1}}) == ["error: 'ValueError' is not a table"]
    assert mismatches({"a": 1}, {"a": True}) == ["a: 1 != True"]  # exact: 1 is not true
    assert mismatches(got, {}, {"message": "(4096)"}) == [
        "message: 'token_num (8192) exceeds' does not contain '(4096)'"
    ]
    assert mismatches(got, {}, {"models.t": "1"}) == ["models.t: 1 does not contain '1'"]


def test_a_check_that_could_not_run_is_recorded_as_undecided():
    """start_line v0.31.0 died in record() (`TypeError: cannot record None`):
    a scenario check that cannot run on the tag (run_check's {"passed": None,
    "error": ...}) is recorded as a comment saying so, not as a verdict."""
    source = get_line()
    name = read_series(source.series)[0]
    error = "Traceback (most recent call last):\n  ...\nImportError: cannot import name 'x'"
    report = {
        "from": source.tag,
        "to": "v9.9.9",
        "patches": [
            {
                "name": name,
                "status": "applies",
                "checks": [
                    {
                        "spec": "bug_c:import_flashinfer_all_reduce",
                        "kwargs": {},
                        "target": {"passed": None, "error": error},
                    },
                    {
                        "spec": "bug_a:standalone",
                        "kwargs": {},
                        "target": {"passed": True, "result": {}},
                        "pinned_before": {"passed": None, "error": ""},
                    },
                ],
            }
        ],
    }
    text = record(report, [name])
    assert "# target: undecided, the check did not run: ImportError: cannot import name 'x'" in text
    assert "# pinned_before: undecided, the check did not run: no result" in text
    checks = tomllib.loads(text)["report"][name]["checks"]
    assert checks == [
        {"spec": "bug_c:import_flashinfer_all_reduce"},
        {"spec": "bug_a:standalone", "target": True},
    ]
