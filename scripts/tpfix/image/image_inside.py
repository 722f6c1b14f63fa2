# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Runs inside the image build (Dockerfile), with the base image's own Python.

Standard library and the base's pip only (any Python >= 3.8); scripts/tpfix/image/image.py
stages it into the build context next to the wheel.  So it is self-contained
on purpose: it keeps its own METADATA reader (wheel_metadata) and name
normalisation (norm, PEP 503) instead of tpfix.core.wheelfile and
packaging.utils.canonicalize_name, which the rest of tpfix uses.

    image_inside.py stage --ctx /ctx --out /delta    # builder stage, FROM the base
    image_inside.py apply --ctx /ctx --delta /delta  # final stage, FROM the base

`stage` checks the wheel against SHA256SUMS, plans what must change (our vllm;
any requirement the series re-pins that the base does not satisfy, from the
hash-checked wheels in the context; FlashInfer's cubin / jit-cache companions
at the same version, from FlashInfer's index), runs `pip install --no-deps`
exactly as a user would, and writes to --out only the files whose bytes
differ from the base, the paths pip removed, and the expected final state.

`apply` copies those files over the base, removes those paths and verifies the
result: every file of the wheel's RECORD, every file of each changed
distribution equal to the builder's `pip install`, one vllm dist-info at our
version, FlashInfer packages at one version, and `pip check` reporting no
problem the base did not already have.  Any failure exits 2 with a message
that starts with "image:".
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

PY = sys.executable
# FlashInfer refuses to start unless flashinfer-cubin has exactly the version
# of flashinfer-python; flashinfer-jit-cache is matched by prefix (its version
# carries a +cuXXX local label).  Neither is on PyPI: FlashInfer's own index.
FI_PYTHON = "flashinfer-python"
FI_COMPANIONS = ("flashinfer-cubin", "flashinfer-jit-cache")


class Fail(Exception):
    pass


def norm(name: str) -> str:
    """canonicalize_name's rule (PEP 503): no tpfix or packaging here."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_hash(digest_hex: str) -> str:
    raw = bytes.fromhex(digest_hex)
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# --- the base's Python environment -------------------------------------------


def installed() -> dict:
    """{normalized project: {name, version, site, dist_info, files}} (files: abs paths)."""
    code = r"""
import json, os, sys
from importlib import metadata
out = {}
for d in metadata.distributions():
    name = d.metadata["Name"]
    path = getattr(d, "_path", None)
    if not name or path is None:
        continue
    site = os.path.dirname(str(path))
    files = []
    for f in d.files or []:
        files.append(os.path.normpath(os.path.join(site, str(f))))
    out.setdefault(name, {"name": name, "version": d.version, "site": site,
                          "dist_info": str(path), "files": files})
json.dump(out, sys.stdout)
"""
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    return {norm(k): v for k, v in json.loads(proc.stdout).items()}


def pip_check() -> list[str]:
    """`pip check` problems, each normalized: the version of the package that has
    the problem is dropped, so the same unmet requirement of vllm 0.27.1 and of
    vllm 0.27.1+tpfix.<n> compare equal."""
    proc = subprocess.run(
        [PY, "-m", "pip", "check", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
    )
    problems = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        m = re.match(r"^(\S+) \S+ (.*)$", line)
        problems.append(f"{norm(m.group(1))} {m.group(2)}" if m else line)
    return sorted(set(problems))


def pip_vendored():
    """The base image pip's own copy of `packaging` (every pip has one): requirement parsing."""
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

    return Requirement, Version


# --- the build context ----------------------------------------------------------


SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")  # sha256sum: "<hex>  <path>"
WHEEL_NAME = re.compile(r"^vllm-[^/]+\.whl$")  # the wheel: top level, not an index's


def read_sums(path: str) -> dict:
    """{relative path: sha256} of a `sha256sum` file; a line of another form is an error."""
    sums = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            m = SUMS_LINE.match(line)
            if not m:
                raise Fail(f"{os.path.basename(path)}, line {n}: not `<sha256>  <path>`: {line!r}")
            sums[m.group(2)] = m.group(1).lower()
    return sums


def check_wheel(ctx: str, version: str) -> str:
    """The one vllm-*.whl entry of dist/SHA256SUMS (other entries: other files), checked."""
    dist = os.path.join(ctx, "dist")
    sums_path = os.path.join(dist, "SHA256SUMS")
    if not os.path.isfile(sums_path):
        raise Fail(
            "dist/SHA256SUMS is missing from the build context: build the wheel "
            "first (./build.sh) and build the image with ./build.sh --image"
        )
    sums = read_sums(sums_path)
    wheels = sorted(n for n in sums if WHEEL_NAME.match(n))
    if len(wheels) != 1:
        listed = ", ".join(wheels) or f"none among {len(sums)} entries"
        raise Fail(
            f"dist/SHA256SUMS lists {len(wheels)} vllm wheels (vllm-*.whl), expected "
            f"exactly one ({listed})"
        )
    name = wheels[0]
    path = os.path.join(dist, name)
    if not os.path.isfile(path):
        raise Fail(
            f"wheel missing: dist/SHA256SUMS lists {name} but the build context has no such "
            "file; rebuild it with ./build.sh"
        )
    want, got = sums[name], sha256_file(path)
    if want != got:
        raise Fail(
            f"sha256 mismatch for {name}: SHA256SUMS says {want}, the file has {got}; "
            "the wheel is not the one ./build.sh produced, rebuild it"
        )
    wheel_version = name.split("-")[1]
    if version and wheel_version != version:
        raise Fail(f"{name} is version {wheel_version}, the build asked for {version}")
    print(f"image: {name}: sha256 {got} matches SHA256SUMS", flush=True)
    return path


def staged_wheels(ctx: str) -> dict:
    """Re-pinned requirements staged by scripts/tpfix/image/image.py: {project: (version, path)}."""
    folder = os.path.join(ctx, "wheels")
    sums_path = os.path.join(folder, "SHA256SUMS")
    if not os.path.isfile(sums_path):
        return {}
    out = {}
    for name, want in read_sums(sums_path).items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or sha256_file(path) != want:
            raise Fail(f"wheels/{name}: missing or sha256 differs from wheels/SHA256SUMS")
        project, version = name.split("-")[:2]
        out[norm(project)] = (version, path)
    return out


def wheel_metadata(wheel: str):
    """(Requires-Dist values, RECORD text) of `wheel`: this module's own
    reader, the standard library's stand-in for tpfix.core.wheelfile."""
    with zipfile.ZipFile(wheel) as z:
        info = next(n for n in z.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n))
        meta = z.read(info).decode()
        record = z.read(info.rsplit("/", 1)[0] + "/RECORD").decode()
    reqs = [r for r in meta.splitlines() if r.startswith("Requires-Dist:")]
    return [r[len("Requires-Dist:") :].strip() for r in reqs], record


# --- stage (builder) -----------------------------------------------------------


def plan(wheel: str, env: dict, staged: dict, fi_index: str) -> dict:
    """What to install on top of the base, and from where."""
    Requirement, Version = pip_vendored()
    reqs, _ = wheel_metadata(wheel)
    upgrades = {}  # project -> (version, wheel path)
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = env.get(norm(req.name))
        if have is None or req.specifier.contains(Version(have["version"]), prereleases=True):
            continue  # satisfied, or missing in the base already (pip check compares)
        if norm(req.name) not in staged:
            raise Fail(
                f"the base has {have['name']} {have['version']} but our vllm requires "
                f"{req}; no wheel for it was staged (scripts/tpfix/image/image.py stages the "
                "re-pins the series makes from pins/)"
            )
        version, path = staged[norm(req.name)]
        if not req.specifier.contains(Version(version), prereleases=True):
            raise Fail(f"staged {os.path.basename(path)} does not satisfy {req}")
        upgrades[norm(req.name)] = (version, path)
    companions = []  # (project, requirement, index url)
    if FI_PYTHON in upgrades:
        fi_version = upgrades[FI_PYTHON][0]
        present = [(c, env[c]) for c in FI_COMPANIONS if c in env]
        if present and not fi_index:
            have = ", ".join(f"{d['name']} {d['version']}" for _, d in present)
            raise Fail(
                f"the base image ships {have}, which must carry the version of "
                f"flashinfer-python ({fi_version}) or FlashInfer refuses to start; "
                "they are not on PyPI. Pass FlashInfer's wheel index, the one vLLM's "
                "own docker/Dockerfile uses: --build-arg FLASHINFER_INDEX_URL=<url> "
                "(./build.sh --image --flashinfer-index <url>)"
            )
        for project, dist in present:
            local = dist["version"].partition("+")[2]
            if project == "flashinfer-jit-cache" and local:
                # One build per CUDA version, under <index>/<cuXXX> (as in vLLM's
                # Dockerfile); keep the base's CUDA flavour.
                spec = f"{project}=={fi_version}+{local}"
                url = fi_index.rstrip("/") + "/" + local
            else:
                spec, url = f"{project}=={fi_version}", fi_index
            companions.append((project, spec, url))
    return {"upgrades": upgrades, "companions": companions}


def pip_install(args: list[str]) -> None:
    cmd = [
        PY,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
        "--no-cache-dir",
        *args,
    ]
    print("image: " + " ".join(cmd[1:]), flush=True)
    env = dict(os.environ, PIP_ROOT_USER_ACTION="ignore")
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        raise Fail(f"pip install failed (exit {proc.returncode}): {' '.join(args)}")


def snapshot(paths) -> dict:
    return {p: sha256_file(p) for p in sorted(set(paths)) if os.path.isfile(p)}


def dirs_of(paths, stop: set) -> set:
    out = set()
    for p in paths:
        d = os.path.dirname(p)
        while d and d not in stop and d != "/":
            out.add(d)
            d = os.path.dirname(d)
    return out


def stage(ctx: str, out: str, version: str, fi_index: str) -> None:
    wheel = check_wheel(ctx, version)
    before = installed()
    if "vllm" not in before:
        raise Fail("the base image has no vllm installed (is it vllm/vllm-openai?)")
    p = plan(wheel, before, staged_wheels(ctx), fi_index)
    touched = ["vllm", *p["upgrades"], *(c for c, _, _ in p["companions"])]
    old_files = [f for t in touched if t in before for f in before[t]["files"]]
    sites = {before[t]["site"] for t in touched if t in before}
    old_dirs = {d for d in dirs_of(old_files, sites) if os.path.isdir(d)}
    # Bytecode the base may hold outside RECORD: pip's uninstall removes it too.
    for d in sorted(old_dirs):
        cache = os.path.join(d, "__pycache__")
        if os.path.isdir(cache):
            old_files += [os.path.join(cache, n) for n in os.listdir(cache)]
            old_dirs.add(cache)
    old_hashes = snapshot(old_files)
    checks_before = pip_check()

    pip_install([wheel, *(path for _, path in p["upgrades"].values())] + ["--no-index"])
    for _project, spec, url in p["companions"]:
        pip_install(["--index-url", url, spec])

    after = installed()
    new_files = [f for t in touched for f in after[t]["files"]]
    new_hashes = snapshot(new_files)
    changed = [f for f, h in new_hashes.items() if old_hashes.get(f) != h]
    removed = [f for f in old_hashes if not os.path.lexists(f)]
    removed += sorted(d for d in old_dirs if not os.path.isdir(d))
    root = os.path.join(out, "root")
    for f in changed:
        dest = root + f
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(f, dest)
    manifest = {
        "version": after["vllm"]["version"],
        "wheel": os.path.basename(wheel),
        "dists": {
            t: {
                "name": after[t]["name"],
                "version": after[t]["version"],
                "dist_info": after[t]["dist_info"],
            }
            for t in touched
        },
        "files": new_hashes,
        "removed": removed,
        "changed": changed,
        "pip_check_base": checks_before,
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    size = sum(os.path.getsize(f) for f in changed)
    print(
        f"image: {len(changed)} files differ from the base ({size / 1e6:.2f} MB), "
        f"{len(removed)} paths removed; changed distributions: "
        + ", ".join(f"{after[t]['name']} {after[t]['version']}" for t in touched),
        flush=True,
    )


# --- apply (final stage) -------------------------------------------------------


def check_installed(manifest: dict, wheel: str) -> list[str]:
    problems = []
    env = installed()
    vllm = env.get("vllm")
    version = manifest["version"]
    if vllm is None or vllm["version"] != version:
        problems.append(f"installed vllm is {vllm and vllm['version']}, expected {version}")
    infos = [
        n
        for site in {d["site"] for d in env.values()}
        for n in os.listdir(site)
        if re.match(r"^vllm-[^-]+\.dist-info$", n)
    ]
    if len(infos) != 1:
        problems.append(f"expected one vllm dist-info, found {sorted(infos)}")
    # Each installed file is read once for both checks below (about 1 GB).
    digests: dict = {}

    def digest(path: str) -> str | None:
        if path not in digests:
            digests[path] = sha256_file(path) if os.path.isfile(path) else None
        return digests[path]

    # Every file of the wheel, byte for byte (RECORD hashes).
    _, record = wheel_metadata(wheel)
    site = vllm["site"] if vllm else ""
    n = 0
    for row in csv.reader(io.StringIO(record)):
        if len(row) < 2 or not row[1]:
            continue  # RECORD itself
        path = os.path.normpath(os.path.join(site, row[0]))
        n += 1
        if digest(path) is None:
            problems.append(f"{row[0]}: in the wheel, not installed")
        elif record_hash(digest(path)) != row[1]:
            problems.append(f"{row[0]}: differs from the wheel")
    # The whole installed state equals the builder's pip install.
    for path, want in manifest["files"].items():
        if digest(path) != want:
            problems.append(f"{path}: differs from a pip install of the wheel")
    problems += [f"{p}: left over from the base" for p in manifest["removed"] if os.path.lexists(p)]
    for t, d in manifest["dists"].items():
        got = env.get(t)
        if got is None or got["version"] != d["version"]:
            problems.append(f"{d['name']}: {got and got['version']}, expected {d['version']}")
    # FlashInfer: all of its packages at one version.
    fi = env.get(FI_PYTHON)
    for c in FI_COMPANIONS:
        if fi and c in env and env[c]["version"].split("+")[0] != fi["version"]:
            problems.append(
                f"{env[c]['name']} {env[c]['version']} does not match "
                f"flashinfer-python {fi['version']} (FlashInfer would refuse to start)"
            )
    print(f"image: {n} files of {manifest['wheel']} verified against its RECORD", flush=True)
    return problems


def apply(ctx: str, delta: str) -> None:
    with open(os.path.join(delta, "manifest.json")) as f:
        manifest = json.load(f)
    root = os.path.join(delta, "root")
    for dirpath, _dirs, files in os.walk(root):
        target = dirpath[len(root) :] or "/"
        os.makedirs(target, exist_ok=True)
        for name in files:
            dest = os.path.join(target, name)
            if os.path.lexists(dest):
                os.unlink(dest)
            shutil.copy2(os.path.join(dirpath, name), dest)
    for path in sorted(manifest["removed"], key=len, reverse=True):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
    wheel = os.path.join(ctx, "dist", manifest["wheel"])
    problems = check_installed(manifest, wheel)
    base, now = set(manifest["pip_check_base"]), set(pip_check())
    new = sorted(now - base)
    problems += [f"pip check, new problem: {p}" for p in new]
    if problems:
        raise Fail("the image is not a pip install of the wheel:\n  " + "\n  ".join(problems))
    fixed = len(base - now)
    print(
        f"image: pip check: no new problems ({len(now)} already in the base"
        + (f", {fixed} fixed" if fixed else "")
        + ")",
        flush=True,
    )
    for _, d in sorted(manifest["dists"].items()):
        print(f"image: {d['name']} {d['version']}", flush=True)
    print(f"image: ok, vllm {manifest['version']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description="image build steps (see the module docstring)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage")
    s.add_argument("--ctx", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--version", default="")
    s.add_argument("--flashinfer-index", default="")
    a = sub.add_parser("apply")
    a.add_argument("--ctx", required=True)
    a.add_argument("--delta", required=True)
    args = ap.parse_args()
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ behind
    try:
        if args.cmd == "stage":
            stage(args.ctx, args.out, args.version, args.flashinfer_index)
        else:
            apply(args.ctx, args.delta)
    except Fail as e:
        print(f"image: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
