"""bench's discovery of the model a target serves, against a loopback HTTP server."""

from __future__ import annotations

import http.server
import socket
from collections.abc import Iterator
from typing import ClassVar

import pytest

from servepilot.bench.target import served_model
from servepilot.bench.tokenizer import ServerTokenizer
from servepilot.core.errors import ConfigError
from tests.unit.http_thread import serving


class _Models(http.server.BaseHTTPRequestHandler):
    body: ClassVar[bytes] = b""
    status: ClassVar[int] = 200
    seen_auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.seen_auth.append(self.headers.get("Authorization"))
        self._answer(self.status if self.path == "/v1/models" else 404, self.body)

    def do_POST(self) -> None:
        # vLLM's and the gateway's answer to /tokenize for a model they do not serve.
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(404, b'{"error": {"message": "The model `nope` does not exist.", '
                          b'"type": "NotFoundError", "code": 404}}')  # fmt: skip

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def models() -> Iterator[tuple[str, type[_Models]]]:
    handler = type("Handler", (_Models,), {"seen_auth": [], "status": 200})
    with serving(handler) as url:
        yield url, handler


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
        (b"not json", ["did not answer with OpenAI's model list", "--model NAME"]),
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


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_closed_port_is_said_to_be_unreachable_not_a_model_problem() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ConfigError) as err:
        served_model(url, None)
    assert "cannot connect" in err.value.message and "refused" in err.value.message.lower()
    assert "--model" not in f"{err.value.message} {err.value.hint}"
    with pytest.raises(ConfigError) as tok:
        ServerTokenizer(url, "smollm2").encode("hello")
    assert "cannot connect" in tok.value.message
    assert "/tokenize" not in (tok.value.hint or "")


def test_a_target_without_v1_models_says_what_it_answered(
    models: tuple[str, type[_Models]],
) -> None:
    url, handler = models
    handler.status, handler.body = 404, b"<html>Not Found</html>"
    with pytest.raises(ConfigError) as err:
        served_model(url, None)
    assert "GET /v1/models answered 404: <html>Not Found</html>" in err.value.message
    assert "--model NAME" in (err.value.hint or "")


def test_an_unknown_model_is_named_by_the_servers_own_words(
    models: tuple[str, type[_Models]],
) -> None:
    url, _ = models
    with pytest.raises(ConfigError) as err:
        ServerTokenizer(url, "nope").encode("hello")
    assert "answered 404: The model `nope` does not exist." in err.value.message
    assert "does not serve --model 'nope'" in (err.value.hint or "")
