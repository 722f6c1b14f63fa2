# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A folder served over HTTP on 127.0.0.1, for the tests that point pip, uv
or our own code at a local package index (test_index, test_advisories,
test_resolved_sbom, test_image)."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path


class Served:
    """http.server publishing `folder` on 127.0.0.1 (a free port), in a
    thread, while the `with` block runs; `paths` are the requests it
    answered, in order, with their status.  `ranges`: it answers a Range
    request with the bytes asked for (206), as package indexes do; set it
    False for a server that answers the whole file (200)."""

    def __init__(self, folder: Path, ranges: bool = False):
        self.paths: list[tuple[str, int]] = []
        self.ranges = ranges
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_request(self, code="-", size="-"):
                server.paths.append((self.path, int(code)))

            def log_message(self, *args):
                pass

            def do_GET(self):
                spec, path = self.headers.get("Range"), Path(self.translate_path(self.path))
                if not (server.ranges and spec and path.is_file()):
                    return super().do_GET()
                data = path.read_bytes()
                first, last = spec.removeprefix("bytes=").split("-")
                if not first:  # the last `last` bytes
                    start, end = max(0, len(data) - int(last)), len(data) - 1
                else:  # from `first` to `last` (the end when open)
                    start, end = int(first), int(last) if last else len(data) - 1
                end = min(end, len(data) - 1)
                if start >= len(data):
                    self.send_error(416)
                    return None
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.send_header("Content-Length", str(end - start + 1))
                self.end_headers()
                self.wfile.write(data[start : end + 1])

        handler = functools.partial(Handler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
