# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""A folder served over HTTP on 127.0.0.1, for the tests that point pip or
uv at a local package index (test_index, test_fetch)."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path


class Served:
    """http.server publishing `folder` on 127.0.0.1 (a free port), in a
    thread, while the `with` block runs; `paths` are the requests it
    answered, in order, with their status."""

    def __init__(self, folder: Path):
        self.paths: list[tuple[str, int]] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_request(self, code="-", size="-"):
                server.paths.append((self.path, int(code)))

            def log_message(self, *args):
                pass

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
