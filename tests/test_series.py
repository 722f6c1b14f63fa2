# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""The quilt series: exact application, canonical form, headers, lint, version."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from tpfix.core.lines import LABEL, LINES, get_line, line_names, read_version, sdist_pin, wheel_pin
from tpfix.core.patch_format import read_patch, read_series
from tpfix.core.util import ROOT
from tpfix.maint.series import check
from tpfix.replay.harness import patch_checks, tree_after
from tpfix.stages.verify import touched_files

SERIES = read_series(get_line().series)


@pytest.mark.parametrize("name", line_names())
def test_series_is_not_empty_and_every_patch_is_listed(name: str):
    line = get_line(name)
    names = read_series(line.series)
    assert names
    on_disk = sorted(p.name for p in line.patches.glob("*.patch"))
    assert on_disk == sorted(names), "a patch file is not in series, or vice versa"


@pytest.mark.parametrize("name", line_names())
def test_series_applies_exactly_and_refresh_reproduces_each_patch(name: str):
    line = get_line(name)
    check(line)  # raises Fail naming the patch otherwise


# Every header, of every line (patches/TAG/).
HEADERS = [(get_line(t).patches, n) for t in line_names() for n in read_series(get_line(t).series)]
URL = re.compile(r"^https?://\S+$")
ADDRESS = re.compile(r"^.+ <.+@.+>$")


@pytest.mark.parametrize(
    "folder,name", HEADERS, ids=[f"{d.relative_to(ROOT)}/{n}" for d, n in HEADERS]
)
def test_patch_header_is_complete_in_dep3_vocabulary(folder, name: str):
    patch = read_patch(folder / name)
    h = patch.header
    assert patch.header_text.endswith("\n---\n"), f"{name}: no '---' line between header and diff"
    assert ADDRESS.match(h.mail_field("From") or ""), "From: Name <email>"
    assert re.match(r"^\[PATCH\] \S.{10,}", h.mail_field("Subject") or ""), "Subject: line"
    assert re.search(r"^Subject: .*\n(?: .*\n)*\n", patch.header_text, re.M), "Subject, blank line"
    assert any(ADDRESS.match(v) for v in h.get_all("Signed-off-by")), "Signed-off-by"
    # DEP-3: Forwarded is no, not-needed or where it was sent; Bug is a URL
    (forwarded,) = h.get_all("Forwarded")
    assert forwarded in ("no", "not-needed") or URL.match(forwarded), forwarded
    for bug in h.get_all("Bug"):
        assert URL.match(bug), f"Bug: takes one URL, not {bug!r}"
    refs = h.get_all("Bug") + h.get_all("Related") + h.get_all("Applied-Upstream")
    assert any(re.search(r"#\d+|github\.com/", v) for v in refs + [forwarded]), (
        "upstream issue/PR reference (Bug:, Related:, or Forwarded: URL)"
    )
    # the words that are not DEP-3 (or not ours) any more
    keys = {k.lower() for k, _ in h.trailers}
    assert not keys & {"fixes", "upstream"}, "Fixes: is DEP-3's Bug:, Upstream: is Related:"
    why = [line for line in h.body.splitlines() if line.strip()]
    assert len(why) >= 5, f"{name}: explain why in the body"


@pytest.mark.parametrize(
    "folder,name", HEADERS, ids=[f"{d.relative_to(ROOT)}/{n}" for d, n in HEADERS]
)
def test_every_scenario_field_names_a_replay_with_a_verdict(folder, name: str):
    # scenario_check raises Fail for an unknown module/function/constant or
    # a scenario without its check_<function> verdict
    checks = patch_checks(folder / name)
    assert checks, f"{name}: no Scenario: field shows its fix"
    for c in checks:
        assert c.why and callable(c.passes), c


# the forward ports: every line start_line made (it holds rebase.json)
PORTS = [get_line(t).series for t in line_names() if (get_line(t).patches / "rebase.json").exists()]


@pytest.mark.parametrize("series", PORTS, ids=lambda s: s.parent.name)
def test_every_forward_port_states_its_claims(series):
    for name in read_series(series):
        claims = read_patch(series.parent / name).header.get_all("Claim")
        assert claims and all(len(c) > 40 for c in claims), name


@pytest.mark.parametrize("name", line_names())
def test_version_names_distribution_and_revision(name: str):
    line = get_line(name)
    version = read_version(line.version_file)
    public, local = version.split("+")
    assert f"v{public}" == line.tag == name
    assert public == sdist_pin(line.tag).version
    label, revision = local.split(".")
    assert label == LABEL and int(revision) >= 1  # the line's revision (test_revision.py)


def test_every_line_is_one_folder_with_pins_for_both_arches():
    assert line_names()[0] == get_line().tag, "the default line comes first"
    for name in line_names():
        line = get_line(name)
        assert line.series.exists() and line.pins.exists(), name
        assert line.patches == LINES / name, name
        assert {line.version_file.parent, line.pins.parent} == {line.patches}, name
        assert {wheel_pin(a, line.tag).arch for a in ("x86_64", "aarch64")} == {
            "x86_64",
            "aarch64",
        }
        assert line.official_cuda().startswith(("12.", "13."))
        assert tomllib.loads(line.pins.read_text())["tag"] == line.tag, line.pins


def test_patched_python_is_ruff_clean_with_vllms_config():
    tree = tree_after(SERIES[-1])
    files = sorted(f for f in touched_files(get_line()) if f.endswith(".py"))
    assert files, "the series touches no Python file"
    for args in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *args, *files],
            cwd=tree,
            text=True,
            capture_output=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
