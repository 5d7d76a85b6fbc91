"""A standard-library HTTP handler served from a thread on 127.0.0.1, for tests of clients
that only need a few fixed answers."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` until the block ends; yields the base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
