"""The benchmark client's connections: a keep-alive pool over the HTTP/1.1 client core
(`servepilot.http1.client`, which parses the answers with llhttp), and what one exchange
records of its answer.

Why not aiohttp: its reader wakes a coroutine for every chunk and keeps a bounded read
buffer (64 KiB by default, which throttles long-context answers: vllm #39963). Here the
answer is decoded in the connection's own callbacks, with one timestamp per socket read, and
the request's coroutine is woken once, when the answer is complete. A benchmark client spends
its CPU per request on this path, so it decides how much load one process can generate.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from servepilot.bench.sse import EventScanner
from servepilot.bench.verdicts import (
    REFUSALS,
    body_verdict,
    retry_after_s,
    stream_verdict,
    text,
    why,
)
from servepilot.http1.client import ClientConnection, connect
from servepilot.http1.errors import MalformedAnswer, UpstreamFailed

_MAX_ERROR_BODY = 4096

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
    text: str = ""
    """The answer's text, when the scanner keeps it (`EventScanner.keep_text`)."""


class Connection:
    """One kept-alive connection (`wire`) and the exchange it carries: the `Sink` of its
    answers and the `Owner` it goes back to. It carries one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.scanner = pool.scanner()
        self.wire: ClientConnection | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.deadline = 0.0
        self.status = 0
        self.replica: str | None = None
        self.retry_after_s: float | None = None
        self.used = False
        """An exchange completed on it (a later one's connection is a reused one)."""
        self._sse = False
        self._body = b""

    @property
    def closed(self) -> bool:
        return self.wire is None or self.wire.closed

    # the exchange ----------------------------------------------------------------------

    def start(self, request: bytes, waiter: asyncio.Future[Answer], deadline: float) -> None:
        assert self.wire is not None
        self.scanner.reset()
        self.status, self.replica, self.waiter, self.deadline = 0, None, waiter, deadline
        self.retry_after_s = None
        self._sse, self._body = False, b""
        self.wire.send(request, self)

    def timeout(self) -> None:
        now = time.perf_counter() - self.pool.t0
        self._finish("timeout", "no complete answer within the timeout", now)

    def abort(self, error: str | None = None, detail: str = "") -> None:
        """Drop the connection; the exchange on it, if any, ends with `error`."""
        if error is not None:
            self._finish(error, detail, time.perf_counter() - self.pool.t0)
        if self.wire is not None:
            self.wire.abort()

    # the answer (the client core's `Sink`) ---------------------------------------------

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status
        ctype = headers.get(b"content-type")
        self._sse = status == 200 and (ctype is None or b"event-stream" in ctype.lower())
        self.replica = text(headers.get(b"x-servepilot-replica"))
        if status in REFUSALS:
            self.retry_after_s = retry_after_s(headers.get(b"retry-after"))

    def on_read(self, data: bytes) -> None:
        if data:
            self._take(data, time.perf_counter() - self.pool.t0)

    def on_end(self, data: bytes) -> None:
        now = time.perf_counter() - self.pool.t0
        if data:
            self._take(data, now)
        if self.status != 200 or not self._sse:
            self._finish(*body_verdict(self.status, self._body), now)
        else:
            self.scanner.finish(now)
            self._finish(*stream_verdict(self.scanner), now)
        self.used = True
        if self.wire is not None:
            self.wire.finish()  # kept alive (back to the pool) or closed

    def on_failure(self, exc: UpstreamFailed, answered: bool) -> None:
        now = time.perf_counter() - self.pool.t0
        wire = self.wire
        if isinstance(exc, MalformedAnswer):
            self._finish("malformed_http", str(exc), now)
        elif not answered and self.used and wire is not None and wire.received == 0:
            self._finish(RETRY, "", now)
        elif not answered:
            self._finish("connection_closed", why(exc.__cause__, "closed before an answer"), now)
        elif self.status == 200 and self._sse and self.scanner.done:
            self.on_end(b"")  # [DONE] arrived; only the framing's last bytes were lost
        else:
            cut = why(exc.__cause__, "closed in the middle of the answer")
            self._finish("stream_interrupted", cut, now)

    def _take(self, data: bytes, now: float) -> None:
        if self._sse:
            self.scanner.feed(data, now)
        elif len(self._body) < _MAX_ERROR_BODY:
            self._body += data[: _MAX_ERROR_BODY - len(self._body)]

    def _finish(self, error: str | None, detail: str, now: float) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return
        scanner = self.scanner
        answer = Answer(error, detail, scanner.chunks, scanner.usage, self.replica, now)
        answer.retry_after_s = self.retry_after_s
        if scanner.keep_text:
            answer.text = scanner.text
        waiter.set_result(answer)
        if error is not None and self.wire is not None:
            self.wire.abort()  # the rest of a failed answer is not worth reading

    # where the connection goes (the client core's `Owner`) -----------------------------

    def put_back(self, wire: ClientConnection) -> None:
        self.pool.release(self)

    def forget(self, wire: ClientConnection) -> None:
        self.pool.forget(self)


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

    async def connect(self, timeout_s: float | None = None) -> Connection:
        """A new connection (`Unreachable` when it cannot be opened within `timeout_s`)."""
        conn = Connection(self)
        conn.wire = await connect(self.host, self.port, conn, timeout_s, self.tls)
        self.open.add(conn)
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
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
