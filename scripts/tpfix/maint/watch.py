# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""Watch the package index for what the release lines need (as Debian's uscan).

    python -m tpfix.maint.watch [--json] [--index-url URL]... [--find-links DIR|URL]...

For every line (patches/<tag>/pins.toml) it lists the vLLM and FlashInfer
(`flashinfer-python`) releases newer than the line's tag and than the
FlashInfer the line ships (`flashinfer-repinned`, else `flashinfer`);
whether each pinned file (the line's and pins/*.toml's) is still served
with its sha256, and the line's runtime pins (`torch`, the FlashInfer it
ships) still exist; and whether every pin of ci/requirements-*.lock still has
a file with one of its hashes.  It reads index pages only (PEP 691 JSON or
PEP 503 HTML, with their `#sha256=` fragments): nothing is downloaded.

The indexes are pip's (`pip config list`: its files and PIP_* variables;
index-url, else pip's default, and extra-index-url) unless --index-url names
them; find-links are pip's unless --find-links names them.  A pinned file
found only in find-links (the CPU torch of the locks) is no problem.

To act on (`!`, exit 1): a broken pin; for the newest line, any newer vLLM
release (start a line for it); for every line, a newer vLLM release of its
own major.minor series and a newer FlashInfer of the shipped one's
major.minor.  Other newer releases are listed only.  Pre- and dev releases
count only where the pin is one.  Exit codes: 0 nothing to act on, 1
something to act on, 2 bad input (options, a pin file or lock), 3 no index
(none configured, or none reachable: one line saying why).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import ssl
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import Request, url2pathname, urlopen

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from tpfix.core.lines import line_tags, pin_artifacts, read_pin_file, tag_version
from tpfix.core.util import ROOT, Fail, main_wrapper, sha256_file
from tpfix.maint.lock import read_lock

NO_INDEX = 3
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


class File(NamedTuple):
    filename: str
    project: str  # canonical
    version: Version
    sha256: str | None
    yanked: bool
    where: str  # "index" or "find-links"
    path: Path | None = None  # a local find-links file (hashed when asked)


def pip_config() -> dict[str, str]:
    """The settings `pip install` reads (install over global, PIP_* over both)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    rank, conf = {"global": 0, "install": 1, ":env:": 2}, {}
    for m in re.finditer(r"(?m)^([^.\s]+)\.([\w-]+)=(.*)$", out):
        if m[1] in rank and rank[m[1]] >= conf.get(m[2], (-1, ""))[0]:
            conf[m[2]] = (rank[m[1]], str(ast.literal_eval(m[3])))
    return {k: v for k, (_, v) in conf.items()}


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a" and dict(attrs).get("href"):
            self.links.append((dict(attrs)["href"], dict(attrs)))


def parse_page(body: bytes, kind: str, base: str, where: str) -> list[File]:
    """The files a simple page (PEP 691 JSON or PEP 503 HTML) or a
    find-links page lists, those named like a wheel or sdist."""
    if kind.startswith("application/vnd.pypi.simple"):
        rows = [
            (f["filename"], f.get("hashes", {}).get("sha256"), bool(f.get("yanked")))
            for f in json.loads(body)["files"]
        ]
    else:
        page = _Links()
        page.feed(body.decode("utf-8", "replace"))
        rows = []
        for href, attrs in page.links:
            url = urlsplit(urljoin(base, href))
            sha = re.search(r"sha256=([0-9a-f]{64})", url.fragment)
            rows.append(
                (unquote(url.path.rsplit("/", 1)[-1]), sha and sha[1], "data-yanked" in attrs)
            )
    return [f for name, sha, yanked in rows if (f := _file(name, sha, yanked, where))]


def _file(name: str, sha: str | None, yanked: bool, where: str, path=None) -> File | None:
    try:
        if name.endswith(".whl"):
            project, version, *_ = parse_wheel_filename(name)
        else:
            project, version = parse_sdist_filename(name)
    except ValueError:  # packaging's Invalid*Filename and InvalidVersion are ValueErrors
        return None
    return File(name, project, version, sha, yanked, where, path)


def _local(url: str) -> Path | None:
    """The folder or file a file: URL or a plain path names; None for a URL."""
    if url.startswith("file:"):
        return Path(url2pathname(urlsplit(url).path))
    return None if "://" in url else Path(url)


class Index:
    """The files of each project on the indexes and in find-links, each page
    read once; an index that does not answer is left out from then on."""

    def __init__(self, urls: list[str], links: list[str], timeout: float, cert: str | None):
        self.urls, self.timeout = urls, timeout
        self.ssl = ssl.create_default_context(
            cafile=cert if cert and Path(cert).is_file() else None
        )
        self.down: dict[str, str] = {}
        self.pages: dict[str, list[File]] = {}
        self.digests: dict[Path, str] = {}
        self.link_sources = links
        self.links = [f for link in links for f in self._find_links(link)]

    def _read(self, url: str) -> tuple[bytes, str] | None:
        """(body, content type) at `url`; None where there is no such page."""
        if (path := _local(url)) is not None:
            page = path / "index.html" if path.is_dir() else path
            return (page.read_bytes(), "text/html") if page.is_file() else None
        request = Request(url, headers={"Accept": ACCEPT})
        try:
            with urlopen(request, timeout=self.timeout, context=self.ssl) as r:
                return r.read(), r.headers.get_content_type()
        except OSError as e:
            if getattr(e, "code", None) in (404, 410):
                return None
            raise

    def _find_links(self, link: str) -> list[File]:
        if (path := _local(link)) is not None and path.is_dir():
            files = [_file(p.name, None, False, "find-links", p) for p in path.iterdir()]
            return [f for f in files if f]
        try:
            got = self._read(link)
        except OSError as e:
            self.down[link] = str(getattr(e, "reason", e))
            return []
        return parse_page(*got, link, "find-links") if got else []

    def files(self, project: str) -> list[File]:
        name = canonicalize_name(project)
        if name not in self.pages:
            found = list(self.links)
            for url in self.urls:
                if url in self.down:
                    continue
                if (path := _local(url)) is not None and not path.is_dir():
                    self.down[url] = "no such folder"
                    continue
                page = f"{url.rstrip('/')}/{name}/"
                try:
                    got = self._read(page)
                except OSError as e:
                    self.down[url] = str(getattr(e, "reason", e))
                    continue
                found += parse_page(*got, page, "index") if got else []
            self.pages[name] = [f for f in found if f.project == name]
        return self.pages[name]

    def sha256(self, f: File) -> str | None:
        if f.sha256 or f.path is None:
            return f.sha256
        if f.path not in self.digests:
            self.digests[f.path] = sha256_file(f.path)
        return self.digests[f.path]

    def served(self, project: str, version: str, hashes: tuple[str, ...], filename=None):
        """(where, why): where a file of project==version with one of `hashes`
        is served ("index", "find-links", "unverified": no hash listed), or
        None and why not."""
        same = [f for f in self.files(project) if f.version == Version(version)]
        same = [f for f in same if filename in (None, f.filename)]
        for where in ("index", "find-links"):
            if any(f.where == where and (not hashes or self.sha256(f) in hashes) for f in same):
                return where, ""
        if any(self.sha256(f) is None for f in same):
            return "unverified", ""
        if not same:
            return None, "not served"
        return None, f"served with another sha256 ({self.sha256(same[0])[:12]}…)"

    def releases(self, project: str, than: Version) -> list[Version]:
        """The versions of `project` on the indexes newer than `than` (not
        yanked, no local versions; pre- and dev releases only where `than` is one)."""
        vs = {f.version for f in self.files(project) if f.where == "index" and not f.yanked}
        pre = than.is_prerelease  # (dev releases are pre-releases to packaging)
        return sorted(v for v in vs if v > than and not v.local and (pre or not v.is_prerelease))


SAID = {"index": "served", "find-links": "from find-links", "unverified": "no sha256 listed"}


def pin(ix: Index, check: str, label: str, name: str, version: str, hashes=(), filename=None):
    """The finding on one pin: served ("ok"), from find-links or unchecked
    ("note"), or not ("act"); `hashes` empty: any file of the version."""
    where, why = ix.served(name, version, hashes, filename)
    status = "act" if where is None else "ok" if where == "index" else "note"
    text = f"{label}: {SAID.get(where, why)}"
    return {"check": check, "status": status, "pin": label, "served": where or why, "text": text}


def newer(ix: Index, project: str, have: Version, act_all: bool, lines=()) -> list[dict]:
    """The releases of `project` newer than `have`, but those of `lines`: to
    act on where `act_all` or of `have`'s major.minor (one item), else a note."""
    found = [v for v in ix.releases(project, have) if v not in lines]
    act = [v for v in found if act_all or v.release[:2] == have.release[:2]]
    rest, series = [v for v in found if v not in act], f"{have.major}.{have.minor}"
    out = []
    for status, new, what in (("act", act, f"than {have}"), ("note", rest, f"outside {series}.x")):
        if not new:
            continue
        text = f"{project} newer {what}: {', '.join(map(str, new))}"
        if status == "act" and act_all:
            text += f" (no line yet: python -m tpfix.maint.start_line v{new[-1]})"
        new = [str(v) for v in new]
        out.append(dict(check="newer", status=status, project=project, new=new, text=text))
    return out


def check_pins(ix: Index, path: Path, data: dict) -> list[dict]:
    return [
        pin(ix, "pin", a.filename, a.project, a.version, (a.sha256,), a.filename)
        for a in pin_artifacts(data, path)
    ]


def check_line(ix: Index, tag: str, path: Path, tags: list[str]) -> dict:
    data = read_pin_file(path)
    ships = {
        "vllm": tag[1:],
        "flashinfer-python": data.get("flashinfer-repinned") or data.get("flashinfer"),
        "torch": data.get("torch"),
    }
    try:
        have = {k: Version(v) for k, v in ships.items()}
    except (TypeError, InvalidVersion):
        why = "must name versions (what the wheel requires)"
        raise Fail(f"{path}: `torch`, `flashinfer` {why}") from None
    out = newer(ix, "vllm", have["vllm"], tag == tags[-1], {tag_version(t) for t in tags})
    out += newer(ix, "flashinfer-python", have["flashinfer-python"], False)
    out += check_pins(ix, path, data)
    for name in ("torch", "flashinfer-python"):  # what the line's wheel requires: any file
        out.append(pin(ix, "runtime", f"{name}=={ships[name]}", name, ships[name]))
    return {"name": tag, "ships": ships, "items": out}


def check_lock(ix: Index, path: Path) -> list[dict]:
    pins = read_lock(path).values()
    with ThreadPoolExecutor(8) as pool:  # the pages, in parallel
        list(pool.map(ix.files, [p.name for p in pins]))
    return [pin(ix, "lock", f"{p.name}=={p.version}", p.name, p.version, p.hashes) for p in pins]


def watch(root: Path, ix: Index) -> list[dict]:
    """The sections (a line, a pin file of pins/, a lock), each with its findings."""
    tags = line_tags(root / "patches")
    if not tags:
        raise Fail(f"{root / 'patches'}: no release line (patches/<tag>/ with VERSION, pins.toml)")
    ix.files("vllm")  # the first page: does any index answer?
    if all(u in ix.down for u in ix.urls):
        why = "; ".join(f"{u}: {ix.down[u]}" for u in ix.urls)
        print(f"error: no package index reachable ({why})", file=sys.stderr)
        sys.exit(NO_INDEX)
    sections = [check_line(ix, t, root / "patches" / t / "pins.toml", tags) for t in tags]
    for pins in sorted((root / "pins").glob("*.toml")):
        found = check_pins(ix, pins, read_pin_file(pins))
        sections.append({"name": f"pins/{pins.name}", "items": found})
    for lock in sorted((root / "ci").glob("requirements-*.lock")):
        sections.append({"name": f"ci/{lock.name}", "items": check_lock(ix, lock)})
    return sections


def show(sections: list[dict], ix: Index) -> None:
    links = f"{', '.join(ix.link_sources)} ({len(ix.links)} files)" if ix.link_sources else "none"
    print(f"indexes: {', '.join(ix.urls)}; find-links: {links}")
    for url, why in ix.down.items():
        print(f"warning: {url} did not answer ({why}): read without it")
    for s in sections:
        ships = ", ".join(f"{k} {v}" for k, v in s.get("ships", {}).items())
        pins = [i for i in s["items"] if i["check"] != "newer"]
        served = sum(i["status"] != "act" for i in pins)
        print(f"{s['name']}{f' ({ships})' if ships else ''}: {served} of {len(pins)} pins served")
        for i in s["items"]:
            if i["status"] != "ok":
                print(f"  {'!' if i['status'] == 'act' else ' '} {i['text']}")
    acts = sum(i["status"] == "act" for s in sections for i in s["items"])
    print(f"to act on: {acts} (marked !)" if acts else "nothing to act on")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index-url", action="append", help="an index to ask instead of pip's")
    ap.add_argument("--find-links", action="append", help="a folder or page instead of pip's")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree to check (default: this)")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per page (default 5)")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = ap.parse_args(argv)
    conf = pip_config()
    urls = args.index_url
    if urls is None and conf.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        urls = []
    elif urls is None:
        from pip._internal.models.index import PyPI  # pip's default index, as pip names it

        urls = [conf.get("index-url") or PyPI.simple_url, *conf.get("extra-index-url", "").split()]
    if not urls:
        print("error: no package index: pip is set to no-index; pass --index-url", file=sys.stderr)
        sys.exit(NO_INDEX)
    links = args.find_links if args.find_links is not None else conf.get("find-links", "").split()
    ix = Index(urls, links, args.timeout, conf.get("cert"))
    sections = watch(args.root, ix)
    acts = sum(i["status"] == "act" for s in sections for i in s["items"])
    if args.json:
        doc = {"indexes": ix.urls, "unreachable": ix.down, "sections": sections, "act": acts}
        print(json.dumps(doc, indent=1))
    else:
        show(sections, ix)
    sys.exit(1 if acts else 0)


if __name__ == "__main__":
    main_wrapper(main)
