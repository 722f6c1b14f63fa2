# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Move the series to another upstream tag and say, per patch, where it stands.

    python -m tpfix.maint.rebase v0.33.0                  # report into build/rebase/v0.33.0/
    python -m tpfix.maint.rebase v0.33.0 --out DIR --no-checks

TAG's sdist is fetched and verified like the pinned tag's (patches/TAG/pins.toml,
or pins/TAG.toml for a tag with no line yet).
Each patch of the source line's series (patches/<from>/series) is tried, in
order, on a working tree: pristine TAG plus the patches kept so far.  Its
class, in the order they are decided:

  absorbed              upstream already has the fix, detected in one of two
                        ways: the patch reverse-applies exactly (upstream
                        carries the same change), or the patch's scenario
                        checks (the `Scenario:` fields of its header,
                        replay.harness.patch_checks) are red on the pinned tag
                        before the patch and green on the working tree.  Not
                        carried; its header can then say `Applied-Upstream:`.
  applies               quilt push --fuzz=0 with no offset: carried unchanged.
  applies-with-changes  applies only with an offset or fuzz, or after a 3-way
                        merge (git merge-file of the pinned tag's file, the
                        patched file and TAG's file).  The refreshed patch
                        (canonical quilt refresh, quilt.REFRESH_ARGS, header
                        kept) is written to OUT/patches/; review it.
  conflicts             none of that works.  The hunks that fail even with
                        fuzz are listed (file, hunk, line in the pinned tag,
                        where patch looked for it in TAG); OUT/conflicts/NAME/
                        has the merge of every conflicting file with diff3
                        markers.  Later patches are tried without it.

OUT/report.json holds the same as the printed table, machine-readable;
OUT/patches/series + patches are the series as carried (a starting point for
patches/TAG/, the reviewed forward port: python -m tpfix.maint.start_line).  Exit status 0 when a
report was written, whatever the classes; 2 on errors (bad pin, failed fetch).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tpfix.core.lines import Line, get_line, line_names, sdist_pin
from tpfix.core.patch_format import HUNK, diff_files, parse_diff, read_series, split, write_series
from tpfix.core.quilt import Quilt, offsets, require
from tpfix.core.util import ROOT, Fail, main_wrapper, run, shown
from tpfix.replay.harness import Check, patch_checks, run_check
from tpfix.stages.patch import cached_tree, pristine_tree

# -- quilt / patch / git helpers --------------------------------------------------


def _patch_cmd(tree: Path, patchfile: Path, *args: str):
    return run(["patch", "-p1", "--dry-run", "-d", str(tree), "-i", str(patchfile), *args])


def reverse_applies(tree: Path, patchfile: Path) -> bool:
    """The patch's change is already in `tree` (offsets allowed, no fuzz).

    -f: take -R literally (--batch would "detect" an unreversed patch and
    apply it forward instead).
    """
    return _patch_cmd(tree, patchfile, "-f", "-R", "--fuzz=0").returncode == 0


def failed_hunks(tree: Path, patchfile: Path, fuzz: int = 2) -> list[dict]:
    """Hunks of `patchfile` that do not apply to `tree` even with `fuzz`."""
    out = _patch_cmd(tree, patchfile, "--batch", "--forward", f"--fuzz={fuzz}")
    diffs = {d.path: d for d in diff_files(patchfile)}
    hunks, current = [], "?"
    lines = (out.stdout + out.stderr).splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"^(?:checking|patching) file (.+)$", line):
            current = m.group(1).strip()
        elif m := re.match(r"^Hunk #(\d+) FAILED at (\d+)", line):
            n, at = int(m.group(1)), int(m.group(2))
            d = diffs.get(current)
            header = d.hunks[n - 1] if d and n <= len(d.hunks) else ""
            hm = HUNK.match(header)
            hunks.append(
                {
                    "file": current,
                    "hunk": n,
                    "header": header,
                    "line": int(hm.group(1)) if hm else None,  # in the pinned tag
                    "tried_at": at,  # where patch looked in the target tag
                }
            )
        elif line.startswith("can't find file to patch"):
            # the file is only named at the end of the quoted text that
            # follows (for a patch's first file, after its whole header)
            for quoted in lines[i + 1 :]:
                if not quoted.startswith(("|", "-", "Perhaps", "The text leading")):
                    break
                if m := re.match(r"^\|(?:\+\+\+|---) [ab]/(\S+)", quoted):
                    current = m.group(1)
            hunks.append(
                {
                    "file": current,
                    "hunk": None,
                    "line": None,
                    "tried_at": None,
                    "header": "missing in the target tag",
                }
            )
        elif "Reversed (or previously applied) patch detected" in line:
            hunks.append(
                {
                    "file": current,
                    "hunk": None,
                    "line": None,
                    "tried_at": None,
                    "header": line.strip(),
                }
            )
    return hunks


def merge3(current: Path, base: Path, other: Path) -> tuple[int, str]:
    """Run git merge-file: (number of conflicts, merged text with diff3 markers)."""
    proc = run(
        [
            "git",
            "merge-file",
            "-p",
            "--diff3",
            "-L",
            "target tag",
            "-L",
            "pinned tag",
            "-L",
            "patched",
            str(current),
            str(base),
            str(other),
        ]
    )
    if proc.returncode < 0 or proc.returncode > 127:
        raise Fail(f"git merge-file failed on {current}: {proc.stderr.strip()}")
    return proc.returncode, proc.stdout


# -- classification ---------------------------------------------------------------


@dataclass
class Trees:
    """Where patch NAME came from: the pinned tag's tree before and after it."""

    before: Path
    after: Path


def classify(
    name: str,
    patchfile: Path,
    q: Quilt,
    origin: Trees | None,
    checks: list[Check],
    runner=None,
) -> dict:
    """Classify patch `name` on q.tree (pristine target + carried patches).

    The tree ends with the patch applied when it is carried (applies,
    applies-with-changes), unchanged otherwise.  `origin` is needed for the
    3-way merge and for the checks' red-before run; `runner(tree, check)`
    runs a check (default run_check: the scenario in a subprocess).
    """
    runner = runner or run_check
    rec: dict = {"name": name, "status": None, "detail": "", "checks": []}
    header, diff = split(patchfile.read_text())

    # 1. absorbed, textually
    if reverse_applies(q.tree, patchfile):
        rec.update(
            status="absorbed",
            how="reverse-applies",
            detail="reverse-applies: upstream carries the same change",
        )
        return rec

    # 2. absorbed, by behaviour: red on the pinned tag before it, green here
    for check in checks:
        entry = {"spec": check.spec, "why": check.why, "kwargs": check.kwargs}
        entry["target"] = runner(q.tree, check)
        if entry["target"]["passed"] and origin is not None:
            entry["pinned_before"] = runner(origin.before, check)
        rec["checks"].append(entry)
    if rec["checks"] and all(
        c["target"]["passed"] and c.get("pinned_before", {}).get("passed") is False
        for c in rec["checks"]
    ):
        rec.update(
            status="absorbed",
            how="checks",
            detail="its scenario checks are red on the pinned tag before the "
            "patch and green on the target tag: fixed upstream",
        )
        return rec

    # 3. applies exactly / with offset or fuzz
    shutil.copyfile(patchfile, q.patches / name)
    write_series(q.series, [*read_series(q.series), name])
    for fuzz in (0, 2):
        proc = q("push", f"--fuzz={fuzz}", name)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            continue
        moved = offsets(out)
        if fuzz == 0 and not moved:
            rec.update(status="applies", detail="quilt push --fuzz=0, no offset")
            return rec
        q.refresh()
        rec.update(
            status="applies-with-changes",
            how="offset/fuzz",
            changes=moved,
            detail=f"{len(moved)} hunk(s) moved or fuzzed; refreshed",
            refreshed=f"patches/{name}",
        )
        return rec

    # 4. 3-way merge of each file the patch touches
    write_series(q.series, [n for n in read_series(q.series) if n != name])
    (q.patches / name).unlink(missing_ok=True)
    hunks = failed_hunks(q.tree, patchfile)
    files = parse_diff(diff)
    if origin is None:
        rec.update(
            status="conflicts",
            hunks=hunks,
            detail="does not apply; no origin trees for a 3-way merge",
        )
        return rec
    merged, conflicts = {}, {}
    for d in files:
        base = origin.before / d.old if d.old else None
        ours = q.tree / d.path
        theirs = origin.after / d.new if d.new else None
        if theirs is None:  # deleted by the patch
            if ours.exists() and base and ours.read_bytes() != base.read_bytes():
                conflicts[d.path] = (1, "deleted by the patch, changed upstream\n")
            merged[d.path] = None
            continue
        if not ours.exists():
            if base is None:  # a new file, still absent upstream
                merged[d.path] = theirs.read_text()
            else:
                conflicts[d.path] = (
                    1,
                    f"{d.path}: not in the target tag (removed or moved upstream, "
                    "or added by an earlier patch that is not carried)\n",
                )
            continue
        with tempfile.TemporaryDirectory() as tmp:
            empty = Path(tmp) / "empty"
            empty.write_text("")
            n, out = merge3(ours, base if base and base.exists() else empty, theirs)
        if n:
            conflicts[d.path] = (n, out)
        else:
            merged[d.path] = out
    if conflicts:
        rec.update(
            status="conflicts",
            hunks=hunks,
            merge_conflicts={p: n for p, (n, _) in conflicts.items()},
            detail=f"{len(hunks)} hunk(s) fail with fuzz 2; 3-way merge conflicts in "
            + ", ".join(f"{p} ({n})" for p, (n, _) in conflicts.items()),
        )
        rec["_conflict_texts"] = {p: t for p, (_, t) in conflicts.items()}
        return rec
    # carry the merge: a new top patch with the merged files, header kept
    if q("new", name).returncode != 0:
        raise Fail(f"quilt new {name} failed in {q.tree}")
    for path in merged:
        if q("add", path).returncode != 0:
            raise Fail(f"quilt add {path} failed in {q.tree}")
    for path, content in merged.items():
        dest = q.tree / path
        if content is None:
            dest.unlink(missing_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(content)
    q.refresh()
    out = q.patches / name
    out.write_text(header + out.read_text())
    rec.update(
        status="applies-with-changes",
        how="3-way merge",
        hunks_before_merge=hunks,
        changes=[f"3-way merge: {p}" for p in merged],
        refreshed=f"patches/{name}",
        detail=f"{len(hunks)} hunk(s) fail as is; 3-way merge of "
        f"{len(merged)} file(s) is clean; refreshed",
    )
    return rec


# -- the whole series ---------------------------------------------------------------


def rebase(
    tag: str,
    out: Path,
    source: Line,
    checks: dict[str, list[Check]] | None = None,
) -> dict:
    """Classify every patch of the `source` line's series on `tag`; write OUT.

    `checks` maps patch names to their scenario checks; by default each
    patch's own, from the `Scenario:` fields of its header ({}: none).
    """
    require()
    pin = sdist_pin(tag)  # the pins of TAG must exist: fail before any work
    series, patches, from_tag = source.series, source.patches, source.tag
    names = read_series(series)
    if checks is None:  # a header that names no existing scenario fails here too
        checks = {name: patch_checks(patches / name) for name in names}
    out = out.resolve()
    if out.exists():
        shutil.rmtree(out)
    (out / "patches").mkdir(parents=True)
    (out / "patches" / "series").write_text("")
    records = []
    uncarried: dict[str, set[str]] = {}  # conflicting patches -> files they touch
    with tempfile.TemporaryDirectory(prefix="rebase.") as tmp:
        tree = pristine_tree(Path(tmp) / "vllm", tag)  # fetch + verify
        q = Quilt(tree, out / "patches")
        for i, name in enumerate(names):
            origin = Trees(
                cached_tree(source, names[i - 1] if i else ""),
                cached_tree(source, name),
            )
            rec = classify(name, patches / name, q, origin, checks.get(name, []))
            touched = {d.path for d in diff_files(patches / name)}
            if rec["status"] == "conflicts":
                # an earlier patch left behind touches the same files: this
                # one was made on top of it, port that one first
                rec["after_uncarried"] = {
                    n: sorted(touched & f) for n, f in uncarried.items() if touched & f
                }
                if rec["after_uncarried"]:
                    rec["detail"] += "; builds on " + ", ".join(rec["after_uncarried"])
                    rec["detail"] += " (not carried): port that one first"
                uncarried[name] = touched
            texts = rec.pop("_conflict_texts", {})
            for path, text in texts.items():
                dest = out / "conflicts" / name / path
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(text)
            records.append(rec)
    report = {
        "from": from_tag,
        "to": tag,
        "sdist": {"filename": pin.filename, "sha256": pin.sha256},
        "series": shown(series),
        "patches": records,
        "carried": read_series(out / "patches" / "series"),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _word(outcome: dict) -> str:
    return {True: "green (fixed)", False: "red (bug)", None: "undecided"}[outcome["passed"]]


def format_table(report: dict) -> str:
    rows = [("patch", "status", "detail")]
    for r in report["patches"]:
        rows.append((r["name"], r["status"], r["detail"]))
        for h in r.get("hunks", []) if r["status"] == "conflicts" else []:
            where = f"{h['file']} hunk #{h['hunk']}" if h["hunk"] else h["file"]
            at = f" (line {h['line']} in {report['from']}, tried at {h['tried_at']})"
            rows.append(("", "", f"  {where}{at if h['hunk'] else ': ' + h['header']}"))
        for c in r.get("checks", []):
            said = f"  check {c['spec']}: {report['to']} {_word(c['target'])}"
            if "pinned_before" in c:
                said += f", {report['from']} before the patch {_word(c['pinned_before'])}"
            rows.append(("", "", said))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    lines.insert(1, "-" * min(120, w0 + w1 + 40))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "tag", help="target upstream tag, with pins (patches/TAG/pins.toml or pins/TAG.toml)"
    )
    ap.add_argument("--out", type=Path, help="output folder (default build/rebase/TAG)")
    ap.add_argument(
        "--from",
        dest="source",
        choices=line_names(),
        default=None,
        help="the line whose series moves (default: the top-level VERSION's)",
    )
    ap.add_argument(
        "--no-checks",
        action="store_true",
        help="skip the scenario checks (textual classification only)",
    )
    args = ap.parse_args()
    out = args.out or ROOT / "build" / "rebase" / args.tag
    line = get_line(args.source)
    checks = {} if args.no_checks else None
    report = rebase(args.tag, out, line, checks)
    print(f"rebase {report['from']} -> {report['to']} ({report['series']})")
    print(format_table(report))
    print(f"\nreport: {out / 'report.json'}\ncarried series: {out / 'patches' / 'series'}")


if __name__ == "__main__":
    main_wrapper(main)
