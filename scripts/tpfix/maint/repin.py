# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Upstream pins a new line cannot take as they are, and the re-pin that
replaces one (tpfix.maint.start_line --repin NAME==VERSION).

unserved(wheel)      the `==` pins of an official wheel that the package index
                     pip is configured with does not serve, for the official
                     image's Python and the wheel's platform (`pip index versions`)
repin_patch(...)     the line's first patch, in the shape of v0.27.1's 0001:
                     requirements/*.txt (with the project's same-version
                     companions, e.g. flashinfer-cubin), docker/Dockerfile's
                     `ARG <PROJECT>_VERSION` and docker/versions.json move together
api_problems(...)    the re-pin checked, not assumed: every FlashInfer name that
                     the tree's vLLM imports (read with ast, `from flashinfer.x
                     import y`, `import flashinfer.x as m` then `m.y`, and the
                     lazy `("flashinfer.x", "y")` pairs) exists in the re-pinned
                     release, and each call vLLM makes of such a function passes
                     keywords and a number of positional arguments it accepts
"""

from __future__ import annotations

import ast
import difflib
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from tpfix.audit.resolution import marker_env
from tpfix.core.util import Fail
from tpfix.core.wheelfile import wheel_requirements

# --- pins the index does not serve ---------------------------------------


def _served_versions(name: str, python: str, platform: str) -> list[str] | None:
    """The versions of `name` pip's index serves for the target (None: pip failed)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", name, "--disable-pip-version-check"]
    cmd += ["--python-version", python, "--only-binary", ":all:"]
    for plat in _platforms(platform):
        cmd += ["--platform", plat]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"^Available versions: (.*)$", proc.stdout, re.M)
    if m:
        return [v.strip() for v in m.group(1).split(",")]
    return [] if "No matching distribution" in proc.stderr + proc.stdout else None


def _platforms(platform: str) -> list[str]:
    """manylinux_2_28_x86_64 and the older manylinux tags a wheel for it may
    carry (manylinux_2_17, manylinux2014): some pips expand them, some do not."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    arch = m[2]
    return [f"manylinux_2_{y}_{arch}" for y in range(int(m[1]), 16, -1)] + [f"manylinux2014_{arch}"]


def unserved(
    wheel: Path, python: str, arch: str, platform: str
) -> list[tuple[str, str, list[str]]]:
    """(name, version, the versions the index has) of each `==` pin of the
    official wheel (markers of the target, no extras) that the index lacks."""
    env = marker_env(python, arch)
    pins = []
    for req in wheel_requirements(wheel):
        spec = list(req.specifier)
        applies = req.marker is None or req.marker.evaluate({**env, "extra": ""})
        if len(spec) == 1 and spec[0].operator == "==" and not req.extras and applies:
            pins.append((req.name, spec[0].version))
    # one pip at a time: pips run side by side share the HTTP cache and were
    # seen to read a project's page half written (a version list cut short)
    got = [_served_versions(name, python, platform) for name, _ in pins]
    out = []
    for (name, version), versions in zip(pins, got):
        if versions is None:
            raise Fail(f"pip index versions {name} failed: is the package index reachable?")
        if version not in versions:
            out.append((name, version, versions))
    return out


def nearby(version: str, versions: list[str]) -> list[str]:
    """The final releases just below and above `version` among `versions`."""
    finals = []
    for v in versions:
        try:
            if not Version(v).is_prerelease:
                finals.append(Version(v))
        except InvalidVersion:
            continue
    want = Version(version)
    below = [v for v in finals if v < want]
    above = [v for v in finals if v > want]
    return [str(v) for v in ([max(below)] if below else []) + ([min(above)] if above else [])]


# --- the re-pin patch ----------------------------------------------------


def parse_repin(text: str) -> tuple[str, str]:
    try:
        req = Requirement(text)
    except Exception:
        req = None
    spec = list(req.specifier) if req else []
    if not req or len(spec) != 1 or spec[0].operator != "==" or req.extras or req.marker:
        raise Fail(f"--repin {text!r}: expected NAME==VERSION, e.g. flashinfer-python==0.7.4")
    return canonicalize_name(req.name), spec[0].version


def _family(name: str) -> str:
    """flashinfer-python -> flashinfer: the prefix its same-version companions share."""
    return canonicalize_name(name).removesuffix("-python")


def repin_edits(tree: Path, name: str, old: str, new: str) -> dict[str, tuple[str, str]]:
    """{path: (before, after)} of every file of `tree` that pins `name` (or a
    same-version companion) at `old`: requirements/*.txt, docker/Dockerfile's
    ARG <FAMILY>_VERSION, docker/versions.json's entries under the family."""
    fam = _family(name)
    req_line = re.compile(
        rf"^({re.escape(fam)}(?:-[a-z0-9-]+)?)==({re.escape(old)})(\s|$)", re.M | re.I
    )
    edits = {}
    for path in sorted((tree / "requirements").glob("*.txt")):
        text = path.read_text()
        after = req_line.sub(lambda m: f"{m[1]}=={new}{m[3]}", text)
        if after != text:
            edits[str(path.relative_to(tree))] = (text, after)
    docker = tree / "docker" / "Dockerfile"
    if docker.exists():
        text = docker.read_text()
        arg = re.compile(
            rf"^(ARG {re.escape(fam.upper().replace('-', '_'))}_VERSION=){re.escape(old)}$", re.M
        )
        after = arg.sub(lambda m: m[1] + new, text)
        if after != text:
            edits["docker/Dockerfile"] = (text, after)
    versions = tree / "docker" / "versions.json"
    if versions.exists():
        text, out, inside = versions.read_text(), [], 0
        for line in text.splitlines(keepends=True):
            if re.search(rf'"{re.escape(fam)}[^"]*"\s*:\s*\{{', line, re.I):
                inside = 1
            elif inside:
                inside += line.count("{") - line.count("}")
                line = line.replace(f'"{old}"', f'"{new}"')
            out.append(line)
        if "".join(out) != text:
            edits["docker/versions.json"] = (text, "".join(out))
    if not any(p.startswith("requirements/") for p in edits):
        raise Fail(f"the tree's requirements/*.txt pin no {name}=={old}: nothing to re-pin")
    return edits


def repin_patch(tree: Path, tag: str, name: str, old: str, new: str, problems: list[str]) -> str:
    """The line's first patch (header and diff) re-pinning `name` from `old` to `new`."""
    diff = []
    for path, (before, after) in repin_edits(tree, name, old, new).items():
        diff += difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
            n=3,
        )
    if problems:
        checked = (
            f"Checked, not assumed (tpfix.maint.repin.api_problems): what vLLM {tag} "
            f"uses of {_family(name)} was read from the tree and looked up in {name} "
            f"{new}.  It lacks these, which a patch of their own must port before "
            "the line ships:"
        )
        checked = (
            textwrap.fill(checked, 76)
            + "\n"
            + "".join(
                textwrap.fill(p, 76, initial_indent="- ", subsequent_indent="  ") + "\n"
                for p in problems
            )
        )
    else:
        checked = (
            textwrap.fill(
                f"Checked, not assumed (tpfix.maint.repin.api_problems): every "
                f"{_family(name)} name that vLLM {tag} imports exists in {name} {new}, "
                "and each call vLLM makes of such a function passes arguments its "
                "signature accepts.",
                76,
            )
            + "\n"
        )
    why = textwrap.fill(
        f"vLLM {tag} pins {name}=={old} (requirements/cuda.txt and the wheel's "
        "Requires-Dist), a release the package index does not serve, so upstream's "
        f"own wheel does not install: pip stops with `No matching distribution found "
        f"for {name}=={old}`.  This re-pins it to {new}, which the index serves, "
        "together with the pins that must carry the same version.",
        76,
    )
    header = f"""\
From: vLLM tpfix maintainers <maintainers@tpfix.invalid>
Subject: [PATCH] [Deps] Re-pin {name} to {new}: {old} is not on the
 package index

{why}

{checked}
The scenario replays run with {new}.

Forwarded: not-needed (upstream pins {old}: a distribution re-pin until the
 index serves it, or upstream moves past it)
Signed-off-by: vLLM tpfix maintainers <maintainers@tpfix.invalid>
---
"""
    return header + "".join(diff)


# --- the re-pinned release has what vLLM uses ------------------------------


def _py_files(root: Path, package: str) -> Iterator[Path]:
    yield from sorted((root / package).rglob("*.py"))


def _module_file(site: Path, module: str) -> Path | None:
    base = site.joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.exists():
            return cand
    return None


class _Release:
    """What the re-pinned release's modules define, read with ast (never imported)."""

    def __init__(self, site: Path):
        self.site = site
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = _module_file(self.site, module)
            self._trees[module] = ast.parse(path.read_text()) if path else None
        return self._trees[module]

    def lookup(self, module: str, name: str, depth: int = 0) -> ast.AST | bool | None:
        """The def of module.name (a FunctionDef/ClassDef), True when it exists
        otherwise (an assignment, a submodule, a module __getattr__), None when absent."""
        if depth > 8:
            return True
        mod = self.tree(module)
        if _module_file(self.site, f"{module}.{name}"):
            return True
        if mod is None:
            return None
        pkg = (
            module
            if _module_file(self.site, module).name == "__init__.py"
            else module.rpartition(".")[0]
        )
        found: ast.AST | bool | None = None
        for node in mod.body if mod else []:
            for sub in [node, *(_guarded(node))]:
                got = self._defines(sub, module, pkg, name, depth)
                if got is not None:
                    found = got if found in (None, True) else found
        if found is None and any(
            isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in mod.body
        ):
            return True
        return found

    def _defines(self, node, module, pkg, name, depth):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name == name
        ):
            return node
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.ImportFrom):
            src = _absolute(node, pkg)
            for alias in node.names:
                if alias.name == "*":
                    got = self.lookup(src, name, depth + 1)
                    if got is not None:
                        return got
                elif (alias.asname or alias.name) == name:
                    return self.lookup(src, alias.name, depth + 1) or True
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    return True
        return None


def _guarded(node: ast.AST) -> list[ast.AST]:
    """Statements inside top-level try/if/with blocks (conditional definitions,
    e.g. `with contextlib.suppress(ImportError): from .x import y`)."""
    out = []
    if isinstance(node, ast.Try | ast.If | ast.With):
        for block in (
            node.body,
            getattr(node, "orelse", []),
            *(h.body for h in getattr(node, "handlers", [])),
        ):
            for sub in block:
                out += [sub, *_guarded(sub)]
    return out


def _absolute(node: ast.ImportFrom, pkg: str) -> str:
    if not node.level:
        return node.module or ""
    base = pkg.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _optional(parents: list[ast.AST]) -> bool:
    """Inside a try that catches ImportError/AttributeError/Exception: vLLM copes."""
    for p in parents:
        if isinstance(p, ast.Try):
            for h in p.handlers:
                names = ast.unparse(h.type) if h.type else "Exception"
                if re.search(r"ImportError|ModuleNotFoundError|AttributeError|Exception", names):
                    return True
    return False


def _walk(node: ast.AST, parents: list[ast.AST]) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    yield node, parents
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, [*parents, node])


def _signature_problem(fn: ast.AST, call: ast.Call) -> str | None:
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    a = fn.args
    params = [p.arg for p in a.posonlyargs + a.args]
    if any(isinstance(x, ast.Starred) for x in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return None
    if not a.vararg and len(call.args) > len(params):
        return f"{len(call.args)} positional arguments, it takes {len(params)}"
    names = set(p.arg for p in a.args + a.kwonlyargs)
    if not a.kwarg:
        bad = [k.arg for k in call.keywords if k.arg not in names]
        if bad:
            return f"keyword {bad[0]!r}, which it does not take"
    return None


def api_problems(
    tree: Path, site: Path, package: str = "flashinfer"
) -> tuple[list[str], list[str]]:
    """(problems, optional) for the re-pinned release unpacked at `site`: each
    name vLLM imports that it lacks, or a call it would refuse; `optional`:
    those inside a try that catches the failure (vLLM falls back)."""
    rel = _Release(site)
    problems: list[str] = []
    optional: list[str] = []
    for path in _py_files(tree, "vllm"):
        try:
            mod = ast.parse(path.read_text())
        except SyntaxError:
            continue
        where = path.relative_to(tree)
        aliases: dict[str, str] = {}  # local name -> flashinfer module
        funcs: dict[str, ast.AST] = {}  # local name -> def in the release
        for node, parents in _walk(mod, []):
            said = None
            if (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] == package
                and not node.level
            ):
                if rel.tree(node.module) is None:
                    said = f"{where}:{node.lineno}: no module {node.module}"
                for alias in node.names:
                    got = rel.lookup(node.module, alias.name) if not said else None
                    if not said and got is None:
                        said = f"{where}:{node.lineno}: {node.module} has no {alias.name}"
                    elif got is not None and got is not True:
                        funcs[alias.asname or alias.name] = got
                    elif got is True and _module_file(site, f"{node.module}.{alias.name}"):
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package:
                        if rel.tree(alias.name) is None:
                            said = f"{where}:{node.lineno}: no module {alias.name}"
                        elif alias.asname:
                            aliases[alias.asname] = alias.name
            elif (
                isinstance(node, ast.Call)
                and len(node.args) >= 2
                and all(
                    isinstance(x, ast.Constant) and isinstance(x.value, str) for x in node.args[:2]
                )
            ):
                modname, attr = node.args[0].value, node.args[1].value
                if (
                    modname.split(".")[0] == package
                    and re.fullmatch(r"[\w.]+", modname)
                    and attr.isidentifier()
                    and (rel.tree(modname) is None or rel.lookup(modname, attr) is None)
                ):
                    said = f"{where}:{node.lineno}: {modname} has no {attr} (lazy import)"
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                if rel.lookup(aliases[node.value.id], node.attr) is None:
                    said = f"{where}:{node.lineno}: {aliases[node.value.id]} has no {node.attr}"
            if isinstance(node, ast.Call) and not said:
                fn = None
                if isinstance(node.func, ast.Name) and node.func.id in funcs:
                    fn = funcs[node.func.id]
                elif (
                    isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in aliases
                ):
                    fn = rel.lookup(aliases[node.func.value.id], node.func.attr)
                bad = _signature_problem(fn, node) if fn not in (None, True) else None
                if bad:
                    said = f"{where}:{node.lineno}: call of {fn.name} with {bad}"
            if said:
                (optional if _optional(parents) else problems).append(said)
    return sorted(set(problems)), sorted(set(optional))
