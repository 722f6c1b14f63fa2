# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Known advisories for what a wheel ships, and our VEX (tpfix.audit.advisories,
tpfix.release.triage).

The advisory tests run the real pip-audit against an OSV-compatible service
simulated on 127.0.0.1 (it answers one made-up advisory for vllm 0.27.1 and
one for jinja2), and against a port nobody listens on; the real uv resolves
from an index of tiny wheels served on 127.0.0.1.  The dist/ they audit is
the package stage's on the tiny wheel of tests/small_dist.py.

Fast tier: triage entries and the pure functions.  Slow tier: every package
stage, subprocess or server, and the real advisory command against the real
index.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from served import Served
from small_dist import check_sums, publish_small, sums
from wheels import make_wheel

from tpfix.audit import advisories
from tpfix.core.context import BuildContext
from tpfix.core.lines import get_line, line_names
from tpfix.core.patch_format import read_patch, read_series
from tpfix.core.util import ROOT, Fail
from tpfix.image import image_sbom
from tpfix.release import sbom, triage, wheel_sbom

ADVISORY = {
    "id": "GHSA-tpfx-test-0001",
    "aliases": ["CVE-2099-0001"],
    "summary": "made-up advisory for this test",
    "affected": [
        {
            "package": {"name": "vllm", "ecosystem": "PyPI"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "0.28.0"}]}],
        }
    ],
}


class _OSV(http.server.BaseHTTPRequestHandler):
    """Simulated OSV API: POST /v1/query answers ADVISORY for vllm 0.27.1 and a
    made-up one for jinja2 3.1.6 (a project the SBOM does not declare), else nothing."""

    asked: list = []
    not_found = False  # answer 404 to every query (a URL that is no OSV API)

    def do_POST(self):
        q = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.asked.append((q["package"]["name"], q["version"]))
        if self.not_found:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        asked = (q["package"]["name"], q["version"])
        other = dict(ADVISORY, id="GHSA-tpfx-test-0002", aliases=[])
        other["affected"] = [
            dict(ADVISORY["affected"][0], package={"name": "jinja2", "ecosystem": "PyPI"})
        ]
        vulns = {("vllm", "0.27.1"): [ADVISORY], ("jinja2", "3.1.6"): [other]}.get(asked)
        body = json.dumps({"vulns": vulns} if vulns else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def osv():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OSV)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _OSV.asked = []
    _OSV.not_found = False
    yield f"http://127.0.0.1:{server.server_port}/v1/query"
    server.shutdown()


def _advise(dist: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpfix.audit.advisories", "--dist", str(dist), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def _pinned(tmp: Path) -> Path:
    req = tmp / "pinned.txt"
    req.write_text("vllm==0.27.1+tpfix.3\njinja2==3.1.6\nflashinfer-python==0.6.16.post4\n")
    return req


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_advisory_report_and_vex_from_the_service(tmp_path: Path, osv: str):
    dist, wheel, _, _ = publish_small(tmp_path)
    proc = _advise(
        dist, "--requirements", str(_pinned(tmp_path)), "--service", "osv", "--osv-url", osv
    )
    assert proc.returncode == 0, proc.stderr
    # vllm is asked for as its upstream version, as scanners read ours
    assert sorted(_OSV.asked) == [
        ("flashinfer-python", "0.6.16.post4"),
        ("jinja2", "3.1.6"),
        ("vllm", "0.27.1"),
    ]
    report = json.loads((dist / f"{wheel.name}.advisories.json").read_text())
    (vllm,) = [d for d in report["dependencies"] if d["name"] == "vllm"]
    assert [v["id"] for v in vllm["vulns"]] in (["GHSA-tpfx-test-0001"], ["CVE-2099-0001"])
    vex_text = (dist / f"{wheel.name}.vex.cdx.json").read_text()
    sbom.validate(vex_text)
    vex = json.loads(vex_text)
    doc = json.loads((dist / f"{wheel.name}.cdx.json").read_text())
    serial = doc["serialNumber"].removeprefix("urn:uuid:")
    by_project = {v["bom-ref"].split(":", 1)[1].split("@")[0]: v for v in vex["vulnerabilities"]}
    assert sorted(by_project) == ["jinja2", "vllm"]
    v = by_project["vllm"]  # ours: a BOM-Link to the SBOM's root
    assert v["affects"] == [
        {"ref": f"urn:cdx:{serial}/1#{doc['metadata']['component']['bom-ref']}"}
    ]
    assert v["analysis"]["state"] == "in_triage"  # no advisories.toml entry for it
    assert v["recommendation"] == "fixed in 0.28.0"
    # every BOM-Link names a bom-ref the SBOM has; any other ref a component of the VEX
    sbom_refs = {
        doc["metadata"]["component"]["bom-ref"],
        *(c["bom-ref"] for c in doc["components"]),
    }
    vex_refs = {c["bom-ref"] for c in vex.get("components", [])}
    for vuln in vex["vulnerabilities"]:
        for a in vuln["affects"]:
            link = a["ref"].removeprefix(f"urn:cdx:{serial}/1#")
            assert link in sbom_refs if link != a["ref"] else a["ref"] in vex_refs, a
    assert by_project["jinja2"]["affects"] == [{"ref": "pkg:pypi/jinja2@3.1.6"}]
    # the VEX names the SBOM it is about (the SBOM, written before, does not name it)
    assert vex["metadata"]["component"]["externalReferences"] == [
        {"type": "bom", "url": f"{wheel.name}.cdx.json"}
    ]
    ext = doc["metadata"]["component"]["externalReferences"]
    assert all(e["type"] != "exploitability-statement" for e in ext)
    assert {f"{wheel.name}.advisories.json", f"{wheel.name}.vex.cdx.json"} <= set(sums(dist))
    check_sums(dist)


def _triaged_line(tmp: Path, text: str):
    """The default line's series, with an advisories.toml of `text`."""
    repo = tmp / "repo"
    line = get_line()
    folder = repo / "patches" / line.tag
    shutil.copytree(line.patches, folder, dirs_exist_ok=True)
    (folder / "advisories.toml").write_text(text)
    return type(line).at(folder)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_vex_takes_the_lines_triage(tmp_path: Path, osv: str):
    """advisories.toml beside the series: a patch that resolves it, or why it does not apply."""
    name = read_series(get_line().series)[1]
    report = advisories.audit([("vllm", "0.27.1")], "osv", osv)
    for state, extra, want_detail in [
        ("resolved_with_pedigree", f'patch = "{name}"', f"fixed by {name} of the series"),
        ("not_affected", 'justification = "code_not_reachable"', "unused API"),
    ]:
        line = _triaged_line(
            tmp_path,
            f'[[advisory]]\nid = "CVE-2099-0001"\nstate = "{state}"\n{extra}\n'
            'detail = "unused API"\n',
        )
        dist, wheel, sdist, official = publish_small(tmp_path / state)
        vex = json.loads(advisories.vex(report, dist / f"{wheel.name}.cdx.json", line))
        (v,) = vex["vulnerabilities"]
        assert v["analysis"]["state"] == state
        assert want_detail in v["analysis"]["detail"]
        if state == "not_affected":
            assert v["analysis"]["justification"] == "code_not_reachable"
        else:  # and the SBOM names it among what that patch resolves
            doc = wheel_sbom.wheel_bom(wheel, BuildContext.resolve(line), sdist, official, 1)
            (patch,) = [
                p
                for p in doc.metadata.component.pedigree.patches
                if any(i.description.startswith(f"{name} ") for i in p.resolves)
            ]
            bug = read_patch(line.patches / name).header.get("Bug")  # its Bug: header
            defect = (
                bug.removeprefix("https://github.com/").replace("/issues/", "#")
                if bug
                else f"tpfix:{name}"
            )
            assert {(i.type.value, i.id) for i in patch.resolves} == {
                ("defect", defect),
                ("security", "CVE-2099-0001"),
            }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[advisory]]\nid = "X"\nstate = "resolved_with_pedigree"\npatch = "9999-nope.patch"\n',
            "`patch` must name a patch of the series",
        ),
        ('[[advisory]]\nid = "X"\nstate = "fixed"\n', "state must be one of"),
        ('[[advisory]]\nid = "X"\nstate = "not_affected"\n', "needs a `justification`"),
        (
            '[[advisory]]\nid = "X"\nstate = "not_affected"\njustification = "nah"\n',
            "justification must be one of",
        ),
        ('[[advisory]\nid = "X"\n', "not valid TOML"),
        ('[[advisory]]\nstate = "in_triage"\n', "needs an `id`"),
    ],
)
def test_a_bad_triage_entry_is_refused_before_any_audit(tmp_path: Path, text: str, message: str):
    with pytest.raises(Fail, match=re.escape(message)):
        triage.load_triage(_triaged_line(tmp_path, text))


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_markers_are_evaluated_for_the_image_not_this_host(tmp_path: Path):
    """This host runs Python 3.11 on x86_64; the image runs 3.12 (and the
    aarch64 wheel an aarch64 one): what the audit must cover follows the image."""
    wheel = make_wheel(
        tmp_path,
        requires=(
            "always==1",
            'newer; python_version > "3.11"',
            'arm; platform_machine == "aarch64"',
            "extra-only; extra == 'audio'",
        ),
    )
    line = get_line()
    x86 = advisories.target(line, "x86_64")
    assert x86["python"] == "3.12" and x86["platform"].startswith("x86_64-manylinux_2_")
    assert advisories.needed(wheel, x86["env"]) == {"always", "newer"}
    arm = advisories.target(line, "aarch64")
    assert advisories.needed(wheel, arm["env"]) == {"always", "newer", "arm"}
    with pytest.raises(Fail, match="lacks 1 of the wheel's requirements on the target.*newer"):
        advisories.check_covers([("always", "1")], advisories.needed(wheel, x86["env"]), "a set")


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_uv_resolves_the_wheel_for_the_image_from_an_index(tmp_path: Path):
    """The real resolver (uv), from an index of tiny wheels served on 127.0.0.1
    (our own tpfix.release.index pages): a requirement with a marker true only in the
    image's Python is resolved, one true only on aarch64 is not."""
    from tpfix.release.index import write_index

    served = tmp_path / "served"
    wheel = make_wheel(
        served,
        requires=(
            'dep-a==1.0; python_version > "3.11"',
            'dep-b==1.0; platform_machine == "aarch64"',
        ),
    )
    deps = [make_wheel(served, "1.0", name, ()) for name in ("dep_a", "dep_b")]
    write_index(served, [wheel, *deps])
    tgt = advisories.target(get_line(), "x86_64")
    with Served(served) as server:
        pins = advisories.resolve(wheel, tgt, f"{server.url}/simple")
    assert sorted(pins) == [("dep-a", "1.0"), ("vllm", wheel.name.split("-")[1])]


def _error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line a failed command ends with (no traceback)."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and proc.stderr.count("error:") == 1, proc.stderr
    return last


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_unreachable_advisory_source_fails_loudly_and_writes_nothing(tmp_path: Path):
    dist, wheel, _, _ = publish_small(tmp_path)
    before = {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/query"
    proc = _advise(
        dist, "--requirements", str(_pinned(tmp_path)), "--service", "osv", "--osv-url", url
    )
    line = _error_line(proc)
    assert f"the advisory source osv at {url} could not be queried" in line
    assert "(unreachable: Connection refused)" in line
    assert "nothing was audited and nothing written" in line
    assert line.endswith("the other source: --service pypi, or OSV's own API (no --osv-url)")
    assert "no known" not in (proc.stdout + proc.stderr).lower()
    assert {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()} == before


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_a_source_answering_404_to_everything_is_named_in_one_line(tmp_path: Path, osv: str):
    dist, wheel, _, _ = publish_small(tmp_path)
    before = {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    _OSV.not_found = True
    proc = _advise(
        dist, "--requirements", str(_pinned(tmp_path)), "--service", "osv", "--osv-url", osv
    )
    assert _OSV.asked  # it did answer: 404
    line = _error_line(proc)
    assert f"the advisory source osv at {osv} could not be queried" in line
    assert "(it answers HTTP 404 Not Found)" in line
    assert line.endswith("the other source: --service pypi, or OSV's own API (no --osv-url)")
    assert {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()} == before


def _skips(n: int, reason: str = "Dependency not found on PyPI and could not be audited") -> dict:
    return {
        "dependencies": [{"name": f"p{i}", "version": "1", "skip_reason": reason} for i in range(n)]
    }


def test_pypi_not_finding_any_project_is_one_line_naming_the_other_source():
    """pip-audit's PyPI service skips each project the per-release JSON API
    answers 404 for (a proxy or mirror that lacks it): 198 skips, one line."""
    pins = [(f"p{i}", "1") for i in range(198)]
    with pytest.raises(Fail) as e:
        advisories.check_skipped(_skips(198), pins, "pypi", None)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("the advisory source pypi (PyPI's per-release JSON API) answered")
    assert "'not found' for all 198 projects" in msg
    assert msg.endswith("the other source: --service osv")


def test_a_cut_list_of_skipped_projects_says_how_many_it_left_out():
    pins = [(f"p{i}", "1") for i in range(200)]
    report = _skips(198)
    report["dependencies"] += [{"name": "p198", "version": "1"}, {"name": "p199", "version": "1"}]
    with pytest.raises(Fail) as e:
        advisories.check_skipped(report, pins, "pypi", None)
    lines = str(e.value).splitlines()
    assert lines[0].startswith("198 of 200 projects could not be audited against pypi")
    assert "(the other source: --service osv)" in lines[0]
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "  ... and 178 more"
    assert lines[1] == "  p0: Dependency not found on PyPI and could not be audited"
    audited = {"dependencies": report["dependencies"][198:]}
    advisories.check_skipped(audited, pins[198:], "osv", None)  # none skipped: no error


def test_unpinned_requirements_are_refused(tmp_path: Path):
    req = tmp_path / "r.txt"
    req.write_text("jinja2>=3\n")
    with pytest.raises(Fail, match="is not pinned"):
        advisories.read_requirements(req)


@pytest.mark.slow
def test_real_advisory_source_reports_or_fails_loudly(built_wheel: Path, tmp_path: Path):
    """The real command on the real wheel: pip resolves its requirements from
    the configured index, pip-audit asks the index's advisory data.  Either a
    full, valid report, or exit 2 saying what could not be resolved or
    audited, with dist/ untouched: never a silent "no advisories"."""
    dist = tmp_path / "dist"
    shutil.copytree(built_wheel.parent, dist)
    before = {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    proc = _advise(dist)
    if proc.returncode == 0:
        sbom.validate((dist / f"{built_wheel.name}.vex.cdx.json").read_text())
        report = json.loads((dist / f"{built_wheel.name}.advisories.json").read_text())
        tgt = advisories.target(get_line(), "x86_64")
        audited = {d["name"] for d in report["dependencies"]}
        assert advisories.needed(built_wheel, tgt["env"]) <= audited
        assert report["tpfix"]["projects"] == len(audited) > 50
        assert "vllm" in audited and "torch" in audited
        check_sums(dist)
    else:
        assert proc.returncode == 2, proc.stderr
        assert (
            "so they cannot be audited" in proc.stderr  # uv could not resolve
            or "could not be queried (" in proc.stderr
            or "answered 'not found' for all" in proc.stderr
            or "could not be audited against" in proc.stderr
        ), proc.stderr
        assert "Traceback" not in proc.stderr
        assert {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()} == before
    print(proc.stderr)


@pytest.mark.parametrize("name", [n for n in line_names()])
def test_every_lines_triage_file_loads(name: str):
    path, entries = triage.load_triage(get_line(name))
    assert path.exists(), f"{path}: each line keeps its (possibly empty) triage"
    assert isinstance(entries, dict)


@pytest.mark.slow  # subprocesses, servers or the pinned sdist: not while editing a patch
def test_image_environment_audited_from_the_images_sbom(tmp_path: Path, osv: str):
    """--image: the exact set an image's SBOM lists (image_sbom.image_bom, the real
    code, on an inventory written here), report and VEX beside that SBOM."""
    # the image holds our wheel: the same version in the SBOM and the inventory
    dist, wheel, sdist, official = publish_small(tmp_path, get_line().version)
    inventory = {
        "base": {"name": "vllm/vllm-openai:v0.27.1", "digest": "sha256:" + "1" * 64},
        "image": {"ref": "localhost/x:1", "config_digest": "sha256:" + "2" * 64, "layers": []},
        "python": [
            {
                "name": "vllm",
                "version": get_line().version,
                "location": "/usr/lib",
            },
            {"name": "jinja2", "version": "3.1.6", "location": "/usr/lib"},
            {"name": "flashinfer_python", "version": "0.6.16.post4", "location": "/usr/lib"},
            {"name": "torch", "version": "2.13.0+cu130", "location": "/usr/lib"},
        ],
    }
    comp = wheel_sbom.wheel_component(wheel, BuildContext.resolve(get_line()), sdist, official)
    (dist / "image").mkdir()
    img = dist / "image" / "x-1.cdx.json"
    img.write_text(
        sbom.dumps(image_sbom.image_bom(inventory, comp, 1, get_line().version, "v0.27.1", "x-1"))
    )
    proc = _advise(dist, "--image", str(img), "--service", "osv", "--osv-url", osv)
    assert proc.returncode == 0, proc.stderr
    # local versions asked for as their public one
    assert sorted(_OSV.asked) == [
        ("flashinfer-python", "0.6.16.post4"),
        ("jinja2", "3.1.6"),
        ("torch", "2.13.0"),
        ("vllm", "0.27.1"),
    ]
    vex = json.loads((dist / "image" / "x-1.vex.cdx.json").read_text())
    serial = json.loads(img.read_text())["serialNumber"].removeprefix("urn:uuid:")
    # pip-audit names an advisory by its id or an alias: by project here
    affects = {v["bom-ref"].split(":", 1)[1]: v["affects"] for v in vex["vulnerabilities"]}
    assert affects["vllm@0.27.1"] == [{"ref": f"urn:cdx:{serial}/1#{comp.bom_ref.value}"}]
    # jinja2 is in the image's SBOM: linked there, not described again
    assert affects["jinja2@3.1.6"] == [{"ref": f"urn:cdx:{serial}/1#pkg:pypi/jinja2@3.1.6"}]
    assert not vex.get("components")
    assert {"image/x-1.advisories.json", "image/x-1.vex.cdx.json"} <= set(sums(dist))
