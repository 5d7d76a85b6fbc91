"""The HTTP/1.1 client core: one keep-alive connection to a server, its answers parsed with
httptools (llhttp, in C), used by the gateway (to its replicas) and by bench (to the server
under test). Each of them keeps its own policies (pooling, retries, timeouts of a whole
exchange, what it measures); the wire is this.

An exchange sends one request's prebuilt bytes and reports the answer to a `Sink` through
plain callbacks, in the event loop's own stack: the head, the body of each read as it
arrives, the end, or the failure (and whether the head had arrived). No coroutine or future
is involved per read, which is what keeps the CPU cost per token low on both sides: a relay
writes each read on to its client, a benchmark client takes one timestamp per read.

A body is delimited by Content-Length, by the chunked coding, or by the server closing the
connection. Interim answers (100 Continue) are skipped. Bytes nobody asked for (after an
answer, or between exchanges) close the connection. Failures reach the sink
as `UpstreamFailed` (http1/errors.py): `MalformedAnswer` for bytes that are not HTTP.

A sink may ask, when the head arrives, for the answer's reads as they came (`pass_through`):
a chunked body is then handed over framing and all, to go to a chunked client unchanged
(the parser still reads every byte, for the answer's end and its validity, and keeps the
pieces of body of the current read in `pieces`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from servepilot.http1.errors import MalformedAnswer, Unreachable, UpstreamFailed

MAX_HEAD_BYTES = 64 * 1024
"""An answer whose head has not ended after this many bytes is refused (MalformedAnswer)."""


class Sink(Protocol):
    """Receives one answer."""

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        """The status and the headers (names lower-cased; a repeated one keeps its last)."""
        ...

    def on_read(self, data: bytes) -> None:
        """The body bytes of one read, all at once (b"" when the read held none: the head
        alone): a chance to write them in one go. After `pass_through`: the read as it came
        (less the head, in the read that held it)."""
        ...

    def on_end(self, data: bytes) -> None:
        """The answer is complete; `data` is its body since the last `on_read` (after
        `pass_through`: the last read as it came, the end of the chunked body included)."""
        ...

    def on_failure(self, exc: UpstreamFailed, answered: bool) -> None:
        """The exchange failed; `answered` tells whether the head had arrived."""
        ...


class Owner(Protocol):
    """Where a connection goes back when its exchange is over (its pool)."""

    def put_back(self, conn: ClientConnection) -> None: ...

    def forget(self, conn: ClientConnection) -> None: ...


class ClientConnection(asyncio.Protocol):
    """One keep-alive connection to a server; carries one exchange at a time."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
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
        self.received = 0
        """Bytes of the current answer read before its head was whole (counted only then):
        while the head has not come, 0 means that nothing of the answer has."""
        self._read = b""
        """The read being parsed (after `pass_through`, less the head)."""
        self._split_head = False
        """A read of the answer ended before its head did (or held an interim answer)."""
        self._raw = False
        """The sink takes the reads as they came (`pass_through`)."""
        self._interim = False
        self._reusable = False
        self._draining = False
        self._finished = False
        self.idle_since = 0.0
        self.closed = False

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it. (Both
        # loops open TCP sockets with TCP_NODELAY already: a request leaves in one write.)
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
            self._malformed(f"{exc} (the answer began {data[:80]!r})")
            return
        if self._sink is not sink:  # the answer ended (or failed) in this read
            return
        if raw or self._raw:  # passed through (from this read on, if it held the head)
            sink.on_read(self._read)
            return
        if not self._answered:
            self.received += len(data)
            if self.received > MAX_HEAD_BYTES:
                self._malformed(f"its head is larger than {MAX_HEAD_BYTES} bytes")
                return
            self._split_head = True
        # One read often holds many SSE events (a fast server, a burst): they go on in one
        # call instead of one each.
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
        self._owner.forget(self)
        if self._sink is None:
            return
        if self._answered and self._ends_with_close():
            self.on_message_complete()
            return
        why = f": {exc}" if exc else ""
        failure = UpstreamFailed(f"the server closed the connection{why}")
        failure.__cause__ = exc
        self._fail(failure)

    def pause_writing(self) -> None:  # request bodies are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._sink is None:
            # An answer behind the one asked for, in the same read: the connection's framing
            # cannot be trusted any more (it may be idle in its pool already: closed, it is
            # not reused).
            self.abort()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        sink = self._sink
        if sink is None:
            return
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue and friends: the real head follows
            self._interim = self._split_head = True
            self._headers = {}
            return
        self._answered = True
        sink.on_head(status, self._headers)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
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
        self._answered = self._reusable = False
        self._draining = self._finished = False
        self._split_head = self._raw = False
        self.received = 0
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
            self._owner.put_back(self)
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

    def _ends_with_close(self) -> bool:
        """The answer's body is delimited by the connection's end (no length, not chunked):
        decided when the connection ends, not per answer."""
        headers = self._headers
        return (
            b"content-length" not in headers
            and b"chunked" not in headers.get(b"transfer-encoding", b"")
            and self._parser.get_status_code() not in (204, 304)
        )

    def _malformed(self, why: str) -> None:
        self._fail(MalformedAnswer(f"the server sent a malformed HTTP answer: {why}"))
        self.abort()

    def _fail(self, exc: UpstreamFailed) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.on_failure(exc, self._answered)


async def connect(
    host: str,
    port: int,
    owner: Owner,
    timeout_s: float | None,
    tls: ssl.SSLContext | None = None,
) -> ClientConnection:
    """A new connection to `host`:`port` (over TLS when `tls` is given); `Unreachable` when
    it cannot be opened within `timeout_s` (None: no limit of ours)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, protocol = await loop.create_connection(
                lambda: ClientConnection(owner), host, port, ssl=tls,
                server_hostname=host if tls is not None else None,
            )  # fmt: skip
    except TimeoutError:
        raise Unreachable(
            f"no connection to {host}:{port} within {timeout_s:g} s", timed_out=True
        ) from None
    except OSError as exc:
        raise Unreachable(f"cannot connect to {host}:{port}: {exc}") from None
    return protocol
