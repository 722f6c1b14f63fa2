# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Lock build/venv's requirements: exact versions and sha256 hashes, one set for every line.

    python -m tpfix.maint.lock            # rewrite ci/*.lock from ci/*.txt
    python -m tpfix.maint.lock --check    # offline: do the locks still hold?

The inputs are the requirement files a maintainer edits:

  ci/requirements-build.txt   the build's (./build.sh)      -> requirements-build.lock
  ci/requirements-replay.txt  what the replays import        -> requirements-replay.lock
    + requirements/common.txt of every line's pinned sdist (vLLM's runtime
      requirements: the replays import the real vLLM of each line)
  ci/requirements-test.txt    the test tools (ci/test.sh)    -> requirements-test.lock

ci/venv.sh installs the locks with `pip install --no-deps --require-hashes`,
in that order, each on top of the one before, then runs `pip check`: nothing
is resolved against the index while a lock installs, so a release published
after the lock cannot change what it installs. That is safe because each lock
is complete: every requirement of every locked package (for the target's
markers, with the extras that the inputs and the locked packages ask for) is
itself locked at a version that meets it (`incomplete`, tests/test_lock.py).
All three come from one resolution (uv pip compile, for CPython 3.11 on x86_64
Linux, the venv's Python), so a package in two locks has the same version and
hashes in both, and the one venv satisfies the common.txt of every line at
once: `./build.sh doctor --line v0.33.0` replays with a transformers inside
v0.33.0's range. When a new line's ranges exclude an older line's, the
resolution fails and says so; such lines need venvs of their own.

torch is PyTorch's CPU build (torch==2.13.0+cpu, the hash of that wheel):
nothing here runs CUDA, and the CUDA build on the index weighs GBs with its
nvidia-* packages.  uv finds it where pip does: in pip's find-links (pip
config or PIP_FIND_LINKS; this machine's lies in /opt/wheels), or pass
--find-links DIR.  Installing the locks needs the same file where pip looks.

Rewriting keeps every pin that still meets the inputs (uv takes the current
locks as its preferences): a new line's requirements move only what they must.

--check (the fast tier runs it: tests/test_lock.py) resolves nothing (the
lines' sdists come from the sha256-keyed cache): every pin of a lock carries
a hash; the three locks agree; each lock's pins meet its input file's
requirements, and the replay lock meets every line's common.txt (markers
evaluated for the venv's Python and platform); and, from the metadata of the
packages this venv holds, that each lock is complete.
"""

from __future__ import annotations

import argparse
import email.message
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tpfix.audit.resolution import marker_env
from tpfix.core.lines import line_names
from tpfix.core.util import ROOT, Fail, main_wrapper, sdist_text, shown, write_atomic
from tpfix.stages.fetch import fetch_sdist

CI = ROOT / "ci"
# (input, lock) in install order
LAYERS = [
    (CI / f"requirements-{n}.txt", CI / f"requirements-{n}.lock")
    for n in ("build", "replay", "test")
]
PYTHON = "3.11"
PLATFORM = "x86_64-unknown-linux-gnu"
# the markers of that target
TARGET = marker_env(PYTHON, "x86_64")
HEADER = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution\n"
    "# Generated from {input}{extra}\n"
    "# by `python -m tpfix.maint.lock`: do not edit; edit the input and run it again.\n"
    "# Installed by ci/venv.sh with --no-deps --require-hashes: complete, nothing resolved.\n"
)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]


def read_lock(path: Path) -> dict[str, Pin]:
    """The pins of a lock file (name -> Pin); a line that is not a pin with
    hashes is an error naming the file."""
    pins: dict[str, Pin] = {}
    text = path.read_text().replace("\\\n", " ")
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        if not m or not hashes:
            raise Fail(
                f"{shown(path)}: entry {n} is not `name==version --hash=sha256:...`: {line[:80]}"
            )
        if canonicalize_name(m[1]) in pins:
            raise Fail(f"{shown(path)}: {m[1]} is pinned twice")
        pins[canonicalize_name(m[1])] = Pin(m[1], m[2], hashes)
    return pins


def requirements(text: str, source: str) -> list[Requirement]:
    """The requirements of a requirements file's text (options and comments
    skipped), those whose markers hold for TARGET."""
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            raise Fail(f"{source}: {e}") from None
        if req.marker is None or req.marker.evaluate(TARGET):
            out.append(req)
    return out


def unmet(reqs: list[Requirement], pins: dict[str, Pin], source: str, lock: Path) -> list[str]:
    """Each requirement of `reqs` that the pins of `lock` do not meet, said in one line."""
    problems = []
    for req in reqs:
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{shown(lock)}: no pin for {req} ({source})")
        elif not req.specifier.contains(Version(pin.version), prereleases=True):
            problems.append(
                f"{shown(lock)}: {pin.name}=={pin.version} does not meet {req} ({source})"
            )
    return problems


@functools.cache
def common_txt(tag: str) -> str:
    """requirements/common.txt of the line's pinned sdist (fetched into the
    sha256-keyed cache when missing)."""
    text = sdist_text(fetch_sdist(tag), "requirements/common.txt")
    if text is None:
        raise Fail(f"the {tag} sdist has no requirements/common.txt")
    return text


def problems() -> list[str]:
    """What the locks get wrong, offline (see the module's doc); [] when they hold."""
    found: list[str] = []
    locks: dict[Path, dict[str, Pin]] = {}
    for src, lock in LAYERS:
        if not lock.exists():
            return [f"{shown(lock)} is missing: run python -m tpfix.maint.lock"]
        locks[lock] = read_lock(lock)
        found += unmet(requirements(src.read_text(), shown(src)), locks[lock], shown(src), lock)
    replay = LAYERS[1][1]
    for tag in line_names():
        source = f"{tag} requirements/common.txt"
        found += unmet(requirements(common_txt(tag), source), locks[replay], source, replay)
    seen: dict[str, tuple[Path, Pin]] = {}
    for lock, pins in locks.items():
        for key, pin in pins.items():
            if key in seen and seen[key][1] != pin:
                found.append(f"{shown(lock)} and {shown(seen[key][0])} disagree on {pin.name}")
            seen.setdefault(key, (lock, pin))
    return found


def incomplete(
    lock: Path,
    metadata: Callable[[Pin], email.message.Message | None],
    roots: list[Requirement] = (),
) -> list[str]:
    """Each requirement that a package of `lock` has and `lock` does not meet,
    said in one line: ci/venv.sh installs a lock without resolving anything,
    so what the lock leaves out would be missing.  `metadata(pin)` is the
    package's core metadata (None: unknown, said so); `roots` (the input
    file's requirements) add the extras they ask for.  Markers are evaluated
    for TARGET, with each extra that is asked for of a package."""
    pins = read_lock(lock)
    asked = [(canonicalize_name(p.name), "") for p in pins.values()]
    asked += [(canonicalize_name(r.name), e) for r in roots for e in sorted(r.extras)]
    seen: set[tuple[str, str]] = set()
    found: list[str] = []
    while asked:
        key, extra = asked.pop()
        if (key, extra) in seen or key not in pins:
            continue
        seen.add((key, extra))
        pin = pins[key]
        meta = metadata(pin)
        if meta is None:
            found.append(f"{shown(lock)}: no metadata of {pin.name}=={pin.version} to check")
            continue
        env = {**TARGET, "extra": extra}
        for line in meta.get_all("Requires-Dist") or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if extra and (req.marker is None or "extra" not in str(req.marker)):
                continue  # the package's own requirements: checked without the extra
            via = f"{pin.name}[{extra}]" if extra else pin.name
            found += unmet([req], pins, f"required by {via}", lock)
            asked += [(canonicalize_name(req.name), e) for e in sorted(req.extras)]
    return found


def installed_metadata(pin: Pin) -> email.message.Message | None:
    """The metadata of `pin` as this venv holds it; None unless this venv
    holds exactly that version."""
    try:
        dist = importlib.metadata.distribution(pin.name)
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.metadata if dist.version == pin.version else None


def find_links() -> list[str]:
    """Where pip finds wheels besides the index (the CPU torch): PIP_FIND_LINKS,
    else pip's configured global.find-links."""
    env = os.environ.get("PIP_FIND_LINKS")
    if env:
        return env.split()
    got = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True,
        text=True,
    )
    return got.stdout.split() if got.returncode == 0 else []


def compile_layers(links: list[str]) -> None:
    """One resolution of every input, then each lock constrained to it."""
    uv = [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--python-version", PYTHON]
    uv += ["--python-platform", PLATFORM, "--annotation-style", "line"]
    for link in links:
        uv += ["--find-links", link]
    with tempfile.TemporaryDirectory() as tmp:
        commons = []
        for tag in line_names():
            path = Path(tmp) / f"common-{tag}.txt"
            path.write_text(common_txt(tag))
            commons.append(path)
        whole = Path(tmp) / "all.txt"
        # the versions locked now are uv's preferences (it reads an existing
        # output file so): a pin changes only where the inputs make it
        known = {}
        for _, lock in LAYERS:
            if lock.exists():
                known.update({k: f"{p.name}=={p.version}" for k, p in read_lock(lock).items()})
        whole.write_text("".join(f"{pin}\n" for pin in sorted(known.values())))
        inputs = [str(s) for s, _ in LAYERS] + [str(p) for p in commons]
        _uv(uv + ["--no-header", "-o", str(whole), *inputs])
        for src, lock in LAYERS:
            extra = commons if lock == LAYERS[1][1] else []
            out = Path(tmp) / lock.name
            if lock.exists():
                shutil.copyfile(lock, out)
            cmd = uv + ["--generate-hashes", "--no-header", "-c", str(whole), "-o", str(out)]
            _uv(cmd + [str(src), *map(str, extra)])
            # the constraint is this run's scratch file: not a reason to name
            body = out.read_text().replace(tmp + "/", "").replace("-c all.txt, ", "")
            body = re.sub(r"(, )?-c all\.txt", "", body)
            named = " and requirements/common.txt of " + ", ".join(line_names()) if extra else ""
            write_atomic(lock, HEADER.format(input=shown(src), extra=named) + body)
            print(f"wrote {shown(lock)}: {len(read_lock(lock))} pins", file=sys.stderr)


def _uv(cmd: list[str]) -> None:
    got = subprocess.run(cmd, capture_output=True, text=True)
    if got.returncode != 0:
        raise Fail(f"uv pip compile failed:\n{got.stderr.strip()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="offline: report what the locks get wrong")
    ap.add_argument(
        "--find-links", action="append", help="where the CPU torch wheel lies (default: pip's)"
    )
    args = ap.parse_args()
    if not args.check:
        compile_layers(args.find_links or find_links())
    found = problems()
    if args.check:
        for src, path in LAYERS:
            found += incomplete(path, installed_metadata, requirements(src.read_text(), shown(src)))
    for p in found:
        print(p, file=sys.stderr)
    if found:
        raise Fail(f"{len(found)} problem(s) with the locks; run python -m tpfix.maint.lock")
    print("the locks hold: " + ", ".join(shown(lock) for _, lock in LAYERS), file=sys.stderr)


if __name__ == "__main__":
    main_wrapper(main)
