"""bench's discovery of the model a target serves, against a loopback HTTP server."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from servepilot.bench.target import served_model
from servepilot.core.errors import ConfigError


class _Models(http.server.BaseHTTPRequestHandler):
    body: ClassVar[bytes] = b""
    seen_auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.seen_auth.append(self.headers.get("Authorization"))
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def models() -> Iterator[tuple[str, type[_Models]]]:
    handler = type("Handler", (_Models,), {"seen_auth": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_only_model_is_taken_and_the_key_is_sent(models: tuple[str, type[_Models]]) -> None:
    url, handler = models
    handler.body = b'{"data": [{"id": "smollm2"}]}'
    assert served_model(url, "sk-1") == "smollm2"
    assert handler.seen_auth == ["Bearer sk-1"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"data": [{"id": "a"}, {"id": "b"}]}', ["serves 2 models (a, b)", "--model"]),
        (b'{"data": []}', ["serves 0 models (none)"]),
        (b"not json", ["cannot list the models", "--model NAME"]),
    ],
)
def test_no_single_model_is_a_clear_error(
    models: tuple[str, type[_Models]], body: bytes, words: list[str]
) -> None:
    url, handler = models
    handler.body = body
    with pytest.raises(ConfigError) as err:
        served_model(url, None)
    shown = f"{err.value} {err.value.hint}"
    for word in words:
        assert word in shown
