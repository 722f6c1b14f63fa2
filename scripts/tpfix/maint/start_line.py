# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Prepare the release line of a new upstream tag: pins, carried series, VERSION.

    python -m tpfix.maint.start_line v0.34.0                 # from the newest older line
    python -m tpfix.maint.start_line v0.34.0 --from v0.27.1  # from another line
    python -m tpfix.maint.start_line v0.34.0 --no-checks     # textual classification only
    python -m tpfix.maint.start_line v0.34.0 --repin flashinfer-python==0.7.4

For a tag with no line yet it writes patches/TAG/ (the same shape as every line):

  pins.toml    the sdist and the official x86_64 and aarch64 wheels, pinned
               by the sha256 and size of the files pip downloaded (fetch.
               pin_release; `cuda` read from the wheel's METADATA extras),
               and the facts the versions table shows (tpfix.audit.support_matrix):
               `requires-python`, `torch`, `flashinfer` from the wheels'
               METADATA (both wheels must agree), `image-python` from the
               sdist's docker/Dockerfile, `flashinfer-repinned` with a
               --repin of flashinfer-python.
               Review them before committing: a pin is a reviewed fact.
  series       the source line's series as rebase.py carries it onto TAG:
               absorbed patches dropped, patches that apply exactly or with
               changes (refreshed) carried; conflicting patches are left out
               and listed, their diff3 merges in patches/TAG/conflicts/ for a
               maintainer to port (then add them to the series, delete
               conflicts/, and bump the revision: python -m tpfix.maint.revision bump TAG ...).
  VERSION      <TAG>+tpfix.1: the line's first revision (tpfix.maint.revision)
  CHANGELOG.md its entry, with the fingerprint of the series, patches and pins
  rebase.json  the classification it was made from: {patch: status}
  port.toml    what the rebase recorded of each patch (its conflicts and
               checks) and a [port] entry per carried patch, each `why` left
               for the maintainer to write (tpfix.maint.port_facts; the port
               tests fail until it is)
  advisories.toml  no advisory analysis yet (tpfix.release.triage reads it)

and regenerates the versions table in README.md (tpfix.audit.support_matrix
--readme), which lists every line, and build/venv's locks (ci/*.lock,
tpfix.maint.lock), which then take TAG's requirements/common.txt too.
Without --from it starts from the newest line of an older release (an
absorbed verdict is red on the source's tag, green on TAG), or from the
newest line, with a note, when none is older.

Before anything else is written, the release is checked as it comes: the
sdist's [build-system] requires must be met by build/venv (torch aside), and
every `==` pin of the official x86_64 wheel must be served by the package
index for the official image's Python; a pin that is not is named in one
line with the way out, `--repin NAME==VERSION` (tpfix.maint.repin): the
re-pin becomes the line's first patch (0001, in the shape of v0.27.1's),
checked against what vLLM imports of it (missing names and calls its
signatures refuse are printed and written into the patch's header, for a
maintainer to port), and the scenario checks replay with it.

Nothing is left when the line already exists or a step fails (the folder is
removed again, also on SIGTERM); VERSION is written last, so a folder without
it (after kill -9) is not a line and the next run says to remove it.  When
TAG pins a FlashInfer that has no pin yet, its wheel is pinned in pins.toml
too (role "test"): the scenario checks import it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

from tpfix.audit.resolution import UBUNTU_GLIBC
from tpfix.audit.support_matrix import (
    README,
    WHEEL_FACTS,
    dockerfile_arg,
    image_python,
    update_readme,
    wheel_facts,
)
from tpfix.core.lines import (
    LABEL,
    LINES,
    Line,
    fingerprint,
    get_line,
    line_names,
    newest_line,
    newest_line_before,
    tag_version,
)
from tpfix.core.util import Fail, main_wrapper, sdist_text, shown, sigterm_as_interrupt
from tpfix.core.wheelfile import wheel_requirements
from tpfix.maint import lock, port_facts, repin
from tpfix.maint.rebase import format_table, rebase
from tpfix.replay.deps import api_problems
from tpfix.stages.build import build_requirement_problems
from tpfix.stages.fetch import cached_path, fetch_test_dep, pin_release, pin_test_dep


def _toml_pins(tag: str, arts, cuda: str, facts: dict[str, str]) -> str:
    out = [
        f"# Upstream artifacts of vLLM {tag}: sha256 and size of the files pip",
        "# downloaded (python -m tpfix.maint.start_line).  Review before commit: a",
        "# hash here is a reviewed fact about the release; never edit one to make",
        "# a run pass.",
        "",
        f'tag = "{tag}"',
        "# CUDA of the official wheels (from the extras their METADATA keeps)",
        f'cuda = "{cuda}"',
        "# What the official wheels' METADATA requires (tpfix.audit.support_matrix.wheel_facts)",
        *(f'{k} = "{facts[k]}"' for k in WHEEL_FACTS),
    ]
    if facts.get("flashinfer-repinned"):
        out += [
            "# The flashinfer-python== our wheel requires: 0001 re-pins it (start_line --repin)",
            f'flashinfer-repinned = "{facts["flashinfer-repinned"]}"',
        ]
    if facts.get("image-python"):
        out += [
            "# Python of the official image: PYTHON_VERSION of the sdist's docker/Dockerfile",
            f'image-python = "{facts["image-python"]}"',
        ]
    for a in arts:
        out += ["", "[[artifact]]", f'project = "{a.project}"', f'version = "{a.version}"']
        out += [f'role = "{a.role}"']
        if a.arch:
            out += [f'arch = "{a.arch}"', f'platform = "{a.platform}"']
        out += [f'filename = "{a.filename}"', f"size = {a.size}", f'sha256 = "{a.sha256}"']
    return "\n".join(out) + "\n"


def wheel_cuda(wheel: Path, fallback: str) -> str:
    """13.0 when the official wheel's requirements carry [cu13] extras (12.9 for
    [cu12]); `fallback` (the source line's) when they name neither."""
    extras = {e for r in wheel_requirements(wheel) for e in r.extras}
    if "cu13" in extras:
        return "13.0"
    if "cu12" in extras:
        return "12.9"
    return fallback


def _flashinfer_pin(sdist: Path) -> tuple[str, str] | None:
    """("flashinfer-python", version) that the sdist's requirements/cuda.txt pins."""
    text = sdist_text(sdist, "requirements/cuda.txt")
    if text is None:
        return None
    m = re.search(r"^flashinfer-python==(\S+)", text, re.M)
    return ("flashinfer-python", m.group(1)) if m else None


def _release_facts(sdist: Path, wheels: list[Path]) -> dict[str, str]:
    """The versions table's facts of a release: its wheels' (which must agree)
    and the image's Python from its sdist."""
    facts = wheel_facts(wheels[0])
    for other in wheels[1:]:
        theirs = wheel_facts(other)
        if theirs != facts:
            raise Fail(
                f"{other.name} and {wheels[0].name} require different things: "
                f"{theirs} != {facts}; pin the facts by hand"
            )
    python = image_python(sdist)
    return {**facts, "image-python": python} if python else facts


# A new line's advisories.toml: no analysis recorded yet (tpfix.release.triage).
ADVISORIES = """\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
# Our analysis of known advisories against what this line ships, for the VEX
# that `python -m tpfix.audit.advisories` writes (see its docstring).  An advisory
# the audit finds and this file does not name is reported `in_triage`.
# None is recorded yet.  An entry:
#
# [[advisory]]
# id = "GHSA-xxxx-xxxx-xxxx"     # or its PYSEC / CVE alias
# state = "not_affected"         # resolved | resolved_with_pedigree | exploitable |
#                                #   false_positive | in_triage | not_affected
# justification = "code_not_reachable"   # with not_affected
# patch = "0002-....patch"        # with resolved: the patch of this series that fixes it
# detail = "why, in a sentence"
"""


def _check_release(tag: str, sdist: Path, wheel, facts: dict, repins: dict[str, str]) -> None:
    """The release as it comes (module docstring): build requirements met,
    every upstream `==` pin served or re-pinned; Fail in one line per problem."""
    problems = build_requirement_problems(
        sdist_text(sdist, "pyproject.toml") or "", f"{sdist.name} pyproject.toml"
    )
    python = facts.get("image-python") or "3.12"
    # the official image's platform: the glibc of the Ubuntu its Dockerfile names
    glibc = UBUNTU_GLIBC.get(dockerfile_arg(sdist, "UBUNTU_VERSION") or "", "2_28")
    missing = repin.unserved(cached_path(wheel), python, f"x86_64-manylinux_{glibc}")
    pinned = {canonicalize_name(n): v for n, v, _ in missing}
    for name, version, versions in missing:
        if canonicalize_name(name) not in repins:
            near = ", ".join(repin.nearby(version, versions)) or "none"
            problems.append(
                f"vLLM {tag} pins {name}=={version}, which the package index does not "
                f"serve (nearest: {near}): re-pin it, python -m tpfix.maint.start_line "
                f"{tag} --repin {name}==VERSION (it becomes the line's first patch)"
            )
    upstream = {canonicalize_name(r.name) for r in wheel_requirements(cached_path(wheel))}
    for name in repins:
        if name not in upstream:
            problems.append(f"--repin {name}: vLLM {tag}'s wheel does not require {name}")
        elif name not in pinned:
            print(f"note: --repin {name}: the index serves upstream's pin too", file=sys.stderr)
    if problems:
        raise Fail("\n".join(problems))


def _repin_patch(tag: str, sdist: Path, name: str, new: str) -> tuple[str, str]:
    """(file name, text) of the line's re-pin patch, its API checked against
    the re-pinned release (problems printed and written into the header)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        tree = next(Path(tmp).iterdir())
        text = (tree / "requirements" / "cuda.txt").read_text()
        m = re.search(rf"^{re.escape(name)}==(\S+)", text, re.M | re.I)
        if not m:
            raise Fail(f"--repin {name}: {sdist.name} requirements/cuda.txt pins no {name}")
        wheel = fetch_test_dep(name, new)
        site = Path(tmp) / "site"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        # the project's own import package (flashinfer for flashinfer-python;
        # its wheel also carries other top-level folders vLLM takes elsewhere)
        tops = {n.split("/")[0] for n in z.namelist() if "/" in n and ".dist-info/" not in n}
        own = name.removesuffix("-python").replace("-", "_")
        packages = [own] if own in tops else sorted(tops)
        problems: list[str] = []
        for package in packages:
            problems += api_problems(tree, site, package)[0]
        for p in problems:
            print(f"warning: {name}=={new}: {p}", file=sys.stderr)
        body = repin.repin_patch(tree, tag, name, m.group(1), new, problems)
    return f"0001-repin-{name}-{new}.patch", body


def new_line(
    tag: str, source: Line, checks: bool = True, repins: dict[str, str] | None = None
) -> tuple[Path, dict]:
    """Write patches/TAG/ from `source`'s series (see the module docstring)."""
    repins = repins or {}
    if not re.fullmatch(r"v\d+\.\d+\.\d+", tag):
        raise Fail(f"{tag!r} is not a release tag like v0.34.0")
    dest = LINES / tag
    if (dest / "VERSION").exists():
        raise Fail(f"{shown(dest)} exists: the line is already there")
    if dest.exists():
        raise Fail(
            f"{shown(dest)} has no VERSION: it was left by an interrupted run; "
            f"remove it (rm -r {shown(dest)}) and run again"
        )
    LINES.mkdir(exist_ok=True)
    dest.mkdir()
    try:
        # pins.toml first: rebase fetches TAG through it (a folder without
        # VERSION is not a line yet, so nothing builds from it meanwhile)
        arts = pin_release("vllm", tag[1:])
        sdist = cached_path(next(a for a in arts if a.role == "sdist"))
        wheel = next(a for a in arts if a.arch == "x86_64")
        cuda = wheel_cuda(cached_path(wheel), source.official_cuda())
        facts = _release_facts(sdist, [cached_path(a) for a in arts if a.role == "wheel"])
        _check_release(tag, sdist, wheel, facts, repins)
        fi = _flashinfer_pin(sdist)
        if fi is not None and "flashinfer-python" in repins:
            facts["flashinfer-repinned"] = repins["flashinfer-python"]
            fi = ("flashinfer-python", repins["flashinfer-python"])
        for name, version in dict([*([fi] if fi else []), *repins.items()]).items():
            try:
                fetch_test_dep(name, version)  # pinned already (pins/flashinfer.toml, a line)
            except Fail:
                arts.append(pin_test_dep(name, version))  # the scenario checks need it
        (dest / "pins.toml").write_text(_toml_pins(tag, arts, cuda, facts))
        first = [_repin_patch(tag, sdist, n, v) for n, v in sorted(repins.items())]
        report = rebase(tag, dest / ".rebase", source, checks=None if checks else {})
        carried = report["carried"]
        for name, text in first:
            (dest / name).write_text(text)
        (dest / ".rebase" / "patches" / "series").write_text(
            "".join(f"{n}\n" for n, _ in first) + "".join(f"{n}\n" for n in carried)
        )
        for name in [*carried, "series"]:
            shutil.copyfile(dest / ".rebase" / "patches" / name, dest / name)
        if (dest / ".rebase" / "conflicts").exists():
            shutil.copytree(dest / ".rebase" / "conflicts", dest / "conflicts")
        shutil.rmtree(dest / ".rebase")
        summary = {
            "from": source.tag,
            "to": tag,
            "checks": checks,
            "patches": {r["name"]: r["status"] for r in report["patches"]},
        }
        if repins:  # start_line --repin, as given (test_start_line starts it again so)
            summary["repins"] = dict(sorted(repins.items()))
        (dest / "rebase.json").write_text(json.dumps(summary, indent=2) + "\n")
        (dest / port_facts.FILE).write_text(
            port_facts.record(report, carried, new=[n for n, _ in first])
        )
        (dest / "CHANGELOG.md").write_text(
            f"# {tag} line: changelog\n\n## {tag[1:]}+{LABEL}.1\n\n"
            f"fingerprint: sha256:{fingerprint(Line.at(dest))}\n\n"
            f"First revision: the series of the {source.tag} line carried onto {tag} "
            f"({len(carried)} patches)"
            + "".join(f"; {n} re-pins {v} (start_line --repin)" for n, v in sorted(repins.items()))
            + ".\n"
        )
        (dest / "advisories.toml").write_text(ADVISORIES)
        # VERSION last: it makes the folder a line
        (dest / "VERSION").write_text(f"{tag[1:]}+{LABEL}.1\n")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    if README.exists():  # the versions table lists every line
        update_readme()
    return dest, report


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("tag", help="the new upstream tag, e.g. v0.34.0")
    ap.add_argument(
        "--from",
        dest="source",
        choices=line_names(),
        help="the line whose series moves (default: the newest line of an older release)",
    )
    ap.add_argument("--no-checks", action="store_true", help="skip the scenario checks")
    ap.add_argument(
        "--repin",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="re-pin an upstream pin the index does not serve (the line's first patch)",
    )
    args = ap.parse_args()
    repins = dict(repin.parse_repin(r) for r in args.repin)
    sigterm_as_interrupt()
    source = args.source or newest_line_before(args.tag) or newest_line()
    if tag_version(args.tag) and tag_version(source) > tag_version(args.tag):
        print(
            f"note: {source} is newer than {args.tag}: a patch its series dropped as "
            f"absorbed upstream is not tried on {args.tag}",
            file=sys.stderr,
        )
    dest, report = new_line(args.tag, get_line(source), not args.no_checks, repins)
    print(format_table(report))
    left = [r["name"] for r in report["patches"] if r["status"] == "conflicts"]
    print(
        f"\n{shown(dest)}: pins.toml (review the hashes), series, VERSION, rebase.json,"
        f" {port_facts.FILE} (write each `why`)"
    )
    if left:
        print(f"to port by hand (diff3 merges in {shown(dest / 'conflicts')}): " + ", ".join(left))
    # the replays import every line's vLLM from one venv: its locks take the
    # new line's requirements/common.txt too
    try:
        lock.compile_layers(lock.find_links())
    except Fail as e:
        print(f"warning: ci/*.lock not rewritten for {args.tag}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main_wrapper(main)
