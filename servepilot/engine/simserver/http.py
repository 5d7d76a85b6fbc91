"""A small HTTP/1.1 server for the simulated replica: asyncio protocol over httptools (llhttp).

Why not aiohttp: dozens of simulated replicas share a two-core machine with the gateway under
test, each streaming hundreds of answers. Here a token is one `transport.write` made by the
engine's step loop, with no task switch per token; an idle server runs no timers.

Handlers are synchronous: a handler answers at once (`Exchange.respond`) or starts a stream
(`Exchange.start_stream`) that the engine writes to and ends later. Requests on one
connection are answered in order; one that arrives while a stream runs waits for it to end.
A client that disconnects calls the exchange's `on_close` callback (which aborts its request
in the engine).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import cast

import httptools

_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    received_at: float
    """time.monotonic() when its last byte was read."""


class Exchange:
    """One request and its response."""

    __slots__ = ("_conn", "_streaming", "done", "on_close", "request")

    def __init__(self, conn: _Connection, request: HttpRequest) -> None:
        self._conn = conn
        self.request = request
        self.on_close: Callable[[], None] | None = None
        self.done = False
        self._streaming = False

    @property
    def closed(self) -> bool:
        return self._conn.closed

    def respond(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        head = _head(status, self.request.keep_alive, content_type)
        self._conn.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        self._finish()

    def start_stream(self, content_type: str = "text/event-stream; charset=utf-8") -> None:
        head = _head(200, self.request.keep_alive, content_type)
        self._conn.write(head + b"transfer-encoding: chunked\r\n\r\n")
        self._streaming = True

    def write(self, data: bytes) -> None:
        """One chunk of a started stream."""
        if data:
            self._conn.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self, last: bytes = b"") -> None:
        tail = b"%x\r\n%s\r\n" % (len(last), last) if last else b""
        self._conn.write(tail + b"0\r\n\r\n")
        self._finish()

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            self._conn.exchange_done(self)


Handler = Callable[[Exchange], None]


def _head(status: int, keep_alive: bool, content_type: str) -> bytes:
    phrase = HTTPStatus(status).phrase
    connection = b"keep-alive" if keep_alive else b"close"
    return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\nconnection: %s\r\n" % (
        status, phrase.encode(), content_type.encode(), connection,
    )  # fmt: skip


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._pending: deque[HttpRequest] = deque()
        self._current: Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        current, self._current = self._current, None
        self._pending.clear()
        if current is not None and not current.done and current.on_close is not None:
            current.on_close()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._reject(400, b'{"error":{"message":"malformed HTTP request","code":400}}')

    def _reject(self, status: int, body: bytes) -> None:
        if self._transport is not None and not self.closed:
            head = _head(status, False, "application/json")
            self._transport.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
            self._transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size = b"", {}, [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > _MAX_BODY_BYTES:
            self._reject(413, b'{"error":{"message":"request body too large","code":413}}')
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self.closed:
            return
        url = httptools.parse_url(self._url)
        request = HttpRequest(
            method=self._parser.get_method().decode(),
            path=url.path.decode("latin-1"),
            headers=self._headers,
            body=b"".join(self._body),
            keep_alive=bool(self._parser.should_keep_alive()) and not self._server.closing,
            received_at=time.monotonic(),
        )
        if self._current is None:
            self._handle(request)
        else:
            self._pending.append(request)

    # exchanges
    def _handle(self, request: HttpRequest) -> None:
        exchange = self._current = Exchange(self, request)
        self._server.handler(exchange)

    def write(self, data: bytes) -> None:
        if not self.closed and self._transport is not None:
            self._transport.write(data)

    def exchange_done(self, exchange: Exchange) -> None:
        if exchange is not self._current:
            return
        self._current = None
        if not exchange.request.keep_alive:
            if self._transport is not None:
                self._transport.close()
            return
        if self._pending:
            self._handle(self._pending.popleft())
        elif self._server.closing and self._transport is not None:
            self._transport.close()


class HttpServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections: set[_Connection] = set()
        self.closing = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=4096, reuse_address=True
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    def stop_listening(self) -> None:
        """Refuse new connections; idle kept-alive ones are closed, busy ones after their
        answer."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn._current is None and conn._transport is not None:
                conn._transport.close()

    async def close(self) -> None:
        self.stop_listening()
        for conn in list(self.connections):
            if conn._transport is not None:
                conn._transport.close()
        if self._server is not None:
            await self._server.wait_closed()
