# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Scenarios of a tree's pinned dependencies (FlashInfer), for the patches
that re-pin one (tpfix.maint.start_line --repin) or port vLLM to the re-pin.

Real code only, nothing simulated: the tree's requirements/cuda.txt, its vLLM
sources read with ast, and the FlashInfer release the replay puts on sys.path
(harness.pinned_flashinfer: the tree's pin, or the line's re-pin where the
index does not serve the tree's).

pinned_flashinfer()  the FlashInfer the tree pins is the one the replays run
                     (red: the tree pins a release that cannot be had, and
                     what is tested stands in for it)
flashinfer_api()     every FlashInfer name the tree's vLLM imports exists in
                     that release and each call of such a function passes
                     arguments its signature accepts (api_problems)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path


def _roots() -> tuple[Path, Path]:
    """(the vLLM tree, the FlashInfer site) of this replay interpreter."""
    import flashinfer
    import vllm

    return Path(vllm.__file__).parents[1], Path(flashinfer.__file__).parents[1]


def pinned_flashinfer() -> dict:
    import flashinfer

    tree, _ = _roots()
    text = (tree / "requirements" / "cuda.txt").read_text()
    m = re.search(r"^flashinfer-python==(\S+)", text, re.M)
    return {"pinned": m.group(1) if m else None, "runs": flashinfer.__version__}


def check_pinned_flashinfer(result: dict) -> bool | None:
    if "runs" not in result:
        return None
    return result["pinned"] == result["runs"]


def flashinfer_api() -> dict:
    import flashinfer

    tree, site = _roots()
    problems, optional = api_problems(tree, site)
    return {"flashinfer": flashinfer.__version__, "problems": problems, "optional": optional}


def check_flashinfer_api(result: dict) -> bool | None:
    return result["problems"] == [] if "problems" in result else None


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
