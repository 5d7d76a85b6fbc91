"""A minimal HTTP/1.1 client connection for streamed answers, on a raw asyncio Protocol.

Why not aiohttp: its reader wakes a coroutine for every chunk and keeps a bounded read
buffer (64 KiB by default, which throttles long-context answers: vllm #39963). Here the
answer is decoded in `data_received` itself, with one timestamp per socket read, and the
request's coroutine is woken once, when the answer is complete. A benchmark client spends
its CPU per request on this path, so it decides how much load one process can generate.

Supports what OpenAI-compatible servers send: status line, headers, a body in chunked
encoding, with Content-Length, or delimited by the connection closing; keep-alive.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from servepilot.bench.framing import (
    REFUSALS,
    BadHttp,
    body_verdict,
    dechunk,
    header,
    number,
    retry_after_s,
    status_of,
    stream_verdict,
    text,
    why,
)
from servepilot.bench.sse import EventScanner, excerpt

_MAX_HEAD = 64 * 1024
_MAX_ERROR_BODY = 4096
_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _TRAILER = range(5)

RETRY = "retry"
"""The error of an exchange on a reused connection that closed before any byte of an answer:
almost always the server closing an idle keep-alive connection just as it was reused, so the
request is sent once more on a new connection (its latency keeps counting from the first)."""


@dataclass(slots=True)
class Answer:
    """What one exchange produced (times relative to the client's t0)."""

    error: str | None
    detail: str
    chunks: list[float]
    usage: bytes | None
    replica: str | None
    done_s: float
    retry_after_s: float | None = None
    """A refusal's (429, 503) Retry-After in seconds, when it gave one."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; it carries one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.scanner = pool.scanner()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False
        self.waiter: asyncio.Future[Answer] | None = None
        self.deadline = 0.0
        self.status = 0
        self.replica: str | None = None
        self.retry_after_s: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._state = _HEAD
        self._buf = b""
        self._left = 0
        self._keep_alive = True
        self._sse = False
        self._body = b""
        self._received = False

    # asyncio callbacks -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.waiter is None:
            return
        now = time.perf_counter() - self.pool.t0
        if self._state == _UNTIL_CLOSE:
            self._complete(now)
        elif not self._received and self.used:
            self._finish(RETRY, "", now)
        elif self._state == _HEAD:
            self._finish("connection_closed", why(exc, "closed before an answer"), now)
        elif self.status == 200 and self._sse and self.scanner.done:
            self._complete(now)  # [DONE] arrived; only the framing's last bytes were lost
        else:
            cut = why(exc, "closed in the middle of the answer")
            self._finish("stream_interrupted", cut, now)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter() - self.pool.t0
        if self.waiter is None:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted
            return
        self._received = True
        try:
            if self._state == _HEAD:
                data = self._head(data)
            if self._state == _CHUNKED:
                self._chunked(data, now)
            elif self._state == _LENGTH:
                self._length(data, now)
            elif self._state == _UNTIL_CLOSE:
                self._sink(data, now)
            elif self._state == _TRAILER:
                self._trailer(data, now)
        except BadHttp as exc:
            self._finish("malformed_http", str(exc), now)

    # the exchange ----------------------------------------------------------------------

    def start(self, request: bytes, waiter: asyncio.Future[Answer], deadline: float) -> None:
        assert self.transport is not None
        self._reset()
        self.scanner.reset()
        self.status, self.replica, self.waiter, self.deadline = 0, None, waiter, deadline
        self.retry_after_s = None
        self.transport.write(request)

    def timeout(self) -> None:
        now = time.perf_counter() - self.pool.t0
        self._finish("timeout", "no complete answer within the timeout", now)

    def abort(self, error: str | None = None, detail: str = "") -> None:
        """Drop the connection; the exchange on it, if any, ends with `error`."""
        if error is not None:
            self._finish(error, detail, time.perf_counter() - self.pool.t0)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _finish(self, error: str | None, detail: str, now: float) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return
        scanner = self.scanner
        answer = Answer(error, detail, scanner.chunks, scanner.usage, self.replica, now)
        answer.retry_after_s = self.retry_after_s
        waiter.set_result(answer)
        if error is not None and not self.closed:
            self.abort()  # the rest of a failed answer is not worth reading

    def _complete(self, now: float) -> None:
        self.used = True
        if self.status != 200 or not self._sse:
            self._finish(*body_verdict(self.status, self._body), now)
        else:
            self.scanner.finish(now)
            self._finish(*stream_verdict(self.scanner), now)
        if not self.closed:
            if self._keep_alive and self._state == _HEAD:
                self.pool.release(self)
            else:
                self.abort()

    # HTTP framing ----------------------------------------------------------------------

    def _head(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _MAX_HEAD:
                raise BadHttp("response head larger than 64 KiB")
            self._buf = buf
            return b""
        self._buf = b""
        head = buf[:end]
        if not head.startswith(b"HTTP/1."):
            raise BadHttp(f"not an HTTP/1.x answer: {excerpt(head, 80)}")
        status = status_of(head)
        if 100 <= status < 200:  # 100 Continue and friends: the real head follows
            return self._head(buf[end + 4 :])
        self.status = status
        self._frame(head)
        return buf[end + 4 :]

    def _frame(self, head: bytes) -> None:
        lower = head.lower()
        ctype = header(lower, lower, b"content-type")
        self._sse = self.status == 200 and (ctype is None or b"event-stream" in ctype)
        self.replica = text(header(lower, head, b"x-servepilot-replica"))
        if self.status in REFUSALS:
            self.retry_after_s = retry_after_s(header(lower, lower, b"retry-after"))
        connection = header(lower, lower, b"connection")
        self._keep_alive = connection is None or b"close" not in connection
        encoding = header(lower, lower, b"transfer-encoding")
        length = header(lower, lower, b"content-length")
        if encoding is not None and b"chunked" in encoding:
            self._state = _CHUNKED
        elif length is not None:
            self._state, self._left = _LENGTH, number(length, 10)
        else:
            self._state, self._keep_alive = _UNTIL_CLOSE, False

    def _chunked(self, data: bytes, now: float) -> None:
        if not self._left and not self._buf and (whole := dechunk(data)) is not None:
            body, ended = whole
            if body:
                self._sink(body, now)
            if ended:
                self._state = _HEAD
                self._complete(now)
            return
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos, size, left, pieces = 0, len(buf), self._left, []
        while pos < size:
            if left > 2:  # inside a chunk's data (left counts its closing CRLF too)
                take = min(left - 2, size - pos)
                pieces.append(buf[pos : pos + take])
                pos, left = pos + take, left - take
            elif left:
                take = min(left, size - pos)
                pos, left = pos + take, left - take
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if size - pos > 1024:
                        raise BadHttp("chunk size line too long")
                    self._buf = buf[pos:]
                    break
                length = number(buf[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if length == 0:
                    self._state = _TRAILER
                    break
                left = length + 2
        self._left = left
        if pieces:
            self._sink(pieces[0] if len(pieces) == 1 else b"".join(pieces), now)
        if self._state == _TRAILER:
            self._trailer(buf[pos:], now)

    def _trailer(self, data: bytes, now: float) -> None:
        buf = self._buf + data if self._buf else data
        trailers = buf.find(b"\r\n\r\n")
        end = 2 if buf.startswith(b"\r\n") else trailers + 4 if trailers >= 0 else 0
        if end:
            # Bytes after the answer belong to nothing we asked: do not reuse the connection.
            self._keep_alive = self._keep_alive and len(buf) == end
            self._state, self._buf = _HEAD, b""
            self._complete(now)
        else:
            self._buf = buf

    def _length(self, data: bytes, now: float) -> None:
        if len(data) >= self._left:
            data, self._left = data[: self._left], 0
        else:
            self._left -= len(data)
        self._sink(data, now)
        if self._left == 0:
            self._state = _HEAD
            self._complete(now)

    def _sink(self, data: bytes, now: float) -> None:
        if self._sse:
            self.scanner.feed(data, now)
        elif len(self._body) < _MAX_ERROR_BODY:
            self._body += data[: _MAX_ERROR_BODY - len(self._body)]


class Pool:
    """Kept-alive connections to one server; no upper bound (the load decides how many).

    Timeouts are enforced by one sweep over the open connections every `sweep_s` rather
    than by a timer per request (whose creation and cancellation cost more than the sweep).
    """

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        scanner: Callable[[], EventScanner],
        t0: float,
        sweep_s: float = 1.0,
    ) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.scanner = scanner
        self.t0 = t0
        self.sweep_s = sweep_s
        self._idle: list[Connection] = []
        self.open: set[Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def take(self) -> Connection | None:
        """The most recently used idle connection (its socket buffers are warm), if any."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    def release(self, conn: Connection) -> None:
        self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self.open.discard(conn)

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: Connection(self), self.host, self.port, ssl=self.tls,
            server_hostname=self.host if self.tls is not None else None,
        )  # fmt: skip
        self.open.add(conn)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.sweep_s, self._sweep)
        return conn

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in [c for c in self.open if c.waiter is not None and c.deadline <= now]:
            conn.timeout()
        self._sweeper = loop.call_later(self.sweep_s, self._sweep) if self.open else None

    def abort_all(self, error: str, detail: str) -> None:
        """End every exchange in progress with `error` and drop every connection."""
        for conn in list(self.open):
            conn.abort(error, detail)
        self.open.clear()
        self._idle.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
