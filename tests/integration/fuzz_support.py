"""The gateways the fuzz tests attack, and how they talk to them.

One gateway per test module (two, in fact: one open, one with an API key and the session
policy), each on its own event loop in a thread, in front of an in-process streaming stub; the
tests talk to them with blocking sockets and parse every byte that comes back. `Crashes`
watches for what the fuzzing must never cause: an error logged by a handler or a 5xx.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings

from servepilot.core.config import ApiKey, AuthConfig, GatewayConfig, PolicyName
from tests.integration.gatewayproc import openai_error
from tests.integration.threaded_gateway import ThreadedGateway, Upstream
from tests.support.stub_server import StubConfig, ThreadedStub

MODEL = "stub-model"
KEY = "sk-fuzz-key"
MAX_BODY = 64 * 1024
STUB_CHUNKS = 2
ALLOWED = {200, 400, 401, 404, 405, 413, 429, 503}
DONE_EVENT = b"data: [DONE]\n\n"
VALID_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


# --- the servers ----------------------------------------------------------------------------------


@dataclass
class Servers:
    open: ThreadedGateway
    """No auth, hybrid policy (prefix hashing and length sharding read every body)."""
    keyed: ThreadedGateway
    """One API key, session policy (reads X-Session-Id)."""


class Crashes(logging.Handler):
    """Watches for crashes from the start of a test: anything the gateway logs at ERROR (an
    unexpected exception in a handler) and any 5xx it counts."""

    def __init__(self, servers: Servers) -> None:
        super().__init__(logging.ERROR)
        self.servers = servers
        self.records: list[logging.LogRecord] = []
        self.baseline = [self._fivexx(gw) for gw in (servers.open, servers.keyed)]

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @staticmethod
    def _fivexx(gw: ThreadedGateway) -> int:
        counts = gw.inspect(lambda g: dict(g.metrics.requests))
        return sum(n for (_, code), n in counts.items() if code.startswith("5"))

    def check(self) -> None:
        """No crash so far; both gateways still answer /health, and a chat request."""
        logged = [
            f"{r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
            for r in self.records
        ]
        assert not logged, logged
        now = [self._fivexx(gw) for gw in (self.servers.open, self.servers.keyed)]
        assert now == self.baseline, f"5xx answers counted: {now} (were {self.baseline})"
        for gw in (self.servers.open, self.servers.keyed):
            assert health(gw.port) == 200
        chat = one_request(
            self.servers.open.port,
            request_bytes("POST", "/v1/chat/completions", encode(VALID_CHAT)),
        )
        assert chat.status == 200 and chat.body.endswith(DONE_EVENT), chat


@contextlib.contextmanager
def running_servers() -> Iterator[Servers]:
    """The two gateways and their stub, for one test module; idle again at the end."""
    common: dict[str, Any] = {"port": 0, "health_interval_s": 0.5, "max_body_bytes": MAX_BODY}
    auth = AuthConfig(keys=(ApiKey(name="fuzz", key=KEY),))
    with (
        ThreadedStub(StubConfig(chunks=STUB_CHUNKS)) as stub,
        ThreadedGateway(GatewayConfig(**common), [Upstream("a", stub.url)]) as open_gw,
        ThreadedGateway(
            GatewayConfig(**common, policy=PolicyName.SESSION, auth=auth),
            [Upstream("a", stub.url)],
        ) as keyed_gw,
    ):
        yield Servers(open_gw, keyed_gw)
        for gw in (open_gw, keyed_gw):
            in_flight, queued = gw.inspect(
                lambda g: (g.pool.total_in_flight(), len(g.dispatcher.queue))
            )
            assert (in_flight, queued) == (0, 0)


@contextlib.contextmanager
def watching_crashes(servers: Servers) -> Iterator[Crashes]:
    handler = Crashes(servers)
    logger = logging.getLogger("servepilot.gateway")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# --- talking over a raw socket --------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class _Unclosable(io.BytesIO):
    def close(self) -> None:  # http.client closes its fp after a body; we read on
        pass


class _Sock:
    def __init__(self, fp: io.BytesIO) -> None:
        self._fp = fp

    def makefile(self, *args: Any, **kwargs: Any) -> io.BytesIO:
        return self._fp


def parse_responses(data: bytes) -> tuple[list[Response], bytes]:
    """Every complete response in `data` (interim 1xx skipped), and what is left over."""
    fp = _Unclosable(data)
    out: list[Response] = []
    while fp.tell() < len(data):
        start = fp.tell()
        resp = http.client.HTTPResponse(_Sock(fp))  # type: ignore[arg-type]
        try:
            resp.begin()
            body = resp.read()
        except (http.client.HTTPException, ValueError):
            return out, data[start:]
        out.append(Response(resp.status, resp.headers, body))
    return out, b""


def exchange(
    port: int, data: bytes | list[bytes], *, shut_write: bool = False, idle_s: float = 2.0
) -> tuple[bytes, bool]:
    """Send `data` (pieces sent one by one), read until the server closes or stays silent
    for `idle_s`; (bytes received, whether the server closed the connection)."""
    pieces = [data] if isinstance(data, bytes) else data
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for piece in pieces:
                sock.sendall(piece)
            if shut_write:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it closed on us mid-send: we still read what it said
        sock.settimeout(idle_s)
        received = b""
        while True:
            try:
                got = sock.recv(65536)
            except TimeoutError:
                return received, False
            except ConnectionResetError:
                return received, True
            if not got:
                return received, True
            received += got


def one_request(port: int, raw: bytes) -> Response:
    """Send one whole request (which says `Connection: close`) and parse its one answer."""
    received, closed = exchange(port, raw)
    assert closed, f"the connection stayed open after Connection: close: {received[:300]!r}"
    responses, rest = parse_responses(received)
    assert len(responses) == 1 and not rest, (received[:500], rest[:200])
    return responses[0]


def request_bytes(
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    close: bool = True,
    version: bytes = b"HTTP/1.1",
) -> bytes:
    head = [b"%s %s %s" % (method.encode(), path.encode(), version), b"Host: 127.0.0.1"]
    head += [name + b": " + value for name, value in headers or []]
    if method in ("POST", "PUT", "PATCH") or body:
        head.append(b"Content-Length: %d" % len(body))
    if close:
        head.append(b"Connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def check_answer(resp: Response) -> None:
    """The common property: an allowed status; 4xx in the OpenAI error shape; 200 a whole
    stream from the replica."""
    assert resp.status in ALLOWED, (resp.status, resp.body[:300])
    if 400 <= resp.status < 500:
        assert resp.headers.get_content_type() == "application/json", resp.headers
        openai_error(resp.body)
    elif resp.status in (429, 503):
        assert (resp.headers.get("Retry-After") or "").isdigit()
    if resp.status == 200:
        assert resp.headers.get("X-Servepilot-Replica") == "a"
        assert resp.body.endswith(DONE_EVENT) and resp.body.count(DONE_EVENT) == 1, resp.body


def encode(doc: Any) -> bytes:
    return json.dumps(doc).encode()
