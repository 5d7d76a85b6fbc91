"""Keep-alive HTTP/1.1 connections to the replicas, parsed with httptools (llhttp, in C).

An exchange sends one request's prebuilt bytes and reports the answer to a `Sink` through
plain callbacks, in the event loop's own stack: the head, the body of each read as it
arrives, the end, or the failure (and whether any byte of the answer had arrived, which
decides if the request may be retried on another replica). No coroutine or future is involved
per chunk, which is what keeps the relay's CPU cost per token low.

A sink may ask, when the head arrives, for the answer's reads as they came (`pass_through`):
a chunked body is then handed over framing and all, to go to a chunked client unchanged
(the parser still reads every byte, for the answer's end and its validity, and keeps the
pieces of body of the current read in `pieces`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from servepilot.gateway.errors import UpstreamFailed

# uvicorn (which serves vLLM) closes idle connections after 5 s; dropping ours first avoids
# reusing a connection the replica is closing at that moment, which a POST cannot survive.
KEEPALIVE_S = 4.0


class Sink(Protocol):
    """Receives one upstream answer."""

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None: ...

    def on_read(self, data: bytes) -> None:
        """The body bytes of one read, all at once (b"" when the read held none: the head
        alone): a chance to write them in one go. After `pass_through`: the read as it came
        (less the head, in the read that held it)."""
        ...

    def on_end(self, data: bytes) -> None:
        """The answer is complete; `data` is its body since the last `on_read` (after
        `pass_through`: the last read as it came, the end of the chunked body included)."""
        ...

    def on_failure(self, exc: Exception, answered: bool) -> None:
        """The exchange failed; `answered` tells whether the head had arrived."""
        ...


class Owner(Protocol):
    """Where a connection goes back when its exchange is over (its `HostPool`)."""

    def put_back(self, conn: UpstreamConnection) -> None: ...

    def forget(self, conn: UpstreamConnection) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a replica; carries one exchange at a time."""

    def __init__(self, pool: Owner) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._body: list[bytes] = []
        """The body pieces of the read being parsed (one per chunk of a chunked answer)."""
        # httptools' body callback, once per chunk (per token of a stream): the list's own
        # append, called from C, costs no Python frame. Bound before the parser reads it.
        self.on_body: Callable[[bytes], None] = self._body.append
        self._parser = httptools.HttpResponseParser(self)
        self._sink: Sink | None = None
        self._headers: dict[bytes, bytes] = {}
        self._answered = False
        self._read = b""
        """The read being parsed (after `pass_through`, less the head)."""
        self._split_head = False
        """A read of the answer ended before its head did."""
        self._raw = False
        """The sink takes the reads as they came (`pass_through`)."""
        self._reusable = False
        self._draining = False
        self._finished = False
        self.idle_since = 0.0
        self.closed = False

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        sink = self._sink
        if sink is None:
            # Bytes nobody asked for: the connection's framing cannot be trusted any more.
            self.abort()
            return
        body = self._body
        raw = self._raw
        if raw:
            body.clear()  # `pieces`: this read's only
        self._read = data
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamFailed(f"the replica sent a malformed HTTP answer: {exc}"))
            self.abort()
            return
        if self._sink is not sink:  # the answer ended (or failed) in this read
            return
        if raw or self._raw:  # passed through (from this read on, if it held the head)
            sink.on_read(self._read)
            return
        if not self._answered:
            self._split_head = True
        # One read often holds many SSE events (a fast replica, a burst): they leave in one
        # write instead of one system call each.
        if not body:
            sink.on_read(b"")
        elif len(body) == 1:
            sink.on_read(body.pop())
        else:
            data = b"".join(body)
            body.clear()
            sink.on_read(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._sink is not None:
            why = f": {exc}" if exc else ""
            self._fail(UpstreamFailed(f"the replica closed the connection{why}"))

    def pause_writing(self) -> None:  # request bodies are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks --------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        sink = self._sink
        if sink is None:
            return
        self._answered = True
        sink.on_head(self._parser.get_status_code(), self._headers)

    def on_message_complete(self) -> None:
        sink, self._sink = self._sink, None
        self._reusable = self._parser.should_keep_alive()
        body = self._body
        if self._raw:
            data = self._read  # `pieces` stay for the sink to read
        else:
            data = body[0] if len(body) == 1 else b"".join(body)
            body.clear()
        if sink is not None:
            sink.on_end(data)
        if self._finished:  # drained after its caller was done with it
            self.finish()

    # --- exchanges ------------------------------------------------------------------------

    def send(self, request: bytes, sink: Sink) -> None:
        """Start an exchange; the answer goes to `sink`."""
        assert self.transport is not None and self._sink is None
        self._sink = sink
        self._body.clear()
        self._headers = {}
        self._answered = False
        self._reusable = False
        self._draining = self._finished = False
        self._split_head = self._raw = False
        self.transport.write(request)

    def pass_through(self) -> bool:
        """Called from the sink's `on_head`: hand it this answer's reads as they came from
        the one that holds the head on (its body part), if the answer is chunked (a chunked
        client can then be sent its bytes unchanged). Only for a head that came whole in the
        current read, where the body's start is then known; False otherwise (the sink goes
        on getting the body bytes alone)."""
        read = self._read
        head_end = read.find(b"\r\n\r\n")
        chunked = self._headers.get(b"transfer-encoding") == b"chunked"
        if self._split_head or head_end < 0 or not chunked:
            return False
        self._raw = True
        self._read = read[head_end + 4 :]
        return True

    @property
    def pieces(self) -> list[bytes]:
        """After `pass_through`: the pieces of body of the current read (one per chunk, or
        per part of a chunk that a read boundary cut), for the sink to look at."""
        return self._body

    def drain(self) -> None:
        """The sink has the whole answer although the message has not ended yet (a stream's
        last event came before the end of its chunked body): `finish` then waits for that end
        instead of dropping the connection, which would cost the next request a new one."""
        self._draining = True

    def finish(self) -> None:
        """The exchange is over (answered in full, or abandoned): keep or close the socket."""
        if self._sink is None and self._reusable and not self.closed:
            self._pool.put_back(self)
        elif self._sink is not None and self._draining and not self.closed:
            self._finished = True  # `on_message_complete` comes back here
        else:
            self._sink = None
            self.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def abort(self) -> None:
        """Drop the connection now (an abandoned answer: this also aborts the generation)."""
        self._sink = None
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True

    def _fail(self, exc: Exception) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.on_failure(exc, self._answered)


class HostPool:
    """Idle keep-alive connections to one replica, newest last."""

    def __init__(self, host: str, port: int, connect_timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self._idle: collections.deque[UpstreamConnection] = collections.deque()
        self.open = 0

    def reuse(self) -> UpstreamConnection | None:
        """The newest idle keep-alive connection still fresh enough to reuse, if any: a
        plain call, so that a request on a warm pool awaits nothing to get its connection."""
        idle = self._idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.abort()
        return None

    async def connect(self) -> UpstreamConnection:
        """A new connection (UpstreamFailed when the replica cannot be reached in time)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: UpstreamConnection(self), self.host, self.port
                )
        except TimeoutError:
            raise UpstreamFailed(
                f"no connection to {self.host}:{self.port} within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self.open += 1
        return protocol

    def put_back(self, conn: UpstreamConnection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        self.open -= 1
        with contextlib.suppress(ValueError):  # it was busy, not idle
            self._idle.remove(conn)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()
