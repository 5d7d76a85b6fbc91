"""One HTTP request as the server parsed it, and the means to answer it.

The answer goes straight to the connection's transport: whole (`respond`, with
Content-Length) or as a stream (`start_stream`, `write_chunk`, `end_stream`: chunked transfer
coding for HTTP/1.1 clients, the bare body until the connection closes for HTTP/1.0 ones),
or, for a body that already is in the chunked coding (a proxy relaying a chunked answer), as
it came (`write_framed`, `end_framed`). The head of a stream is held back to leave with its
first chunk, in one write.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Protocol

from mypy_extensions import mypyc_attr

LAST_CHUNK = b"0\r\n\r\n"
JSON = b"application/json"


@functools.cache
def status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    return f"HTTP/1.1 {status} {reason}\r\n".encode()


class ClientSide(Protocol):
    """What a request needs of its client's connection (an `HttpConnection`): a protocol,
    so that the compiled request (core/accel.py) accepts any object with this surface."""

    closed: bool
    paused: bool
    writable_callbacks: list[Callable[[], None]]

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def write(self, data: bytes) -> None: ...

    async def wait_writable(self) -> None: ...

    def abort(self) -> None: ...


# Compiled (core/accel.py), a method call on a native class goes straight to the native
# method unless the class is open to Python subclasses: batch lines run through the gateway
# as a subclass whose `respond` keeps the answer instead of writing it.
@mypyc_attr(allow_interpreted_subclasses=True)
class HttpRequest:
    """One parsed request and the means to answer it (exactly once)."""

    __slots__ = (
        "_conn",
        "_head",
        "body",
        "chunked",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
        "received_at",
        "responded",
        "status",
        "stream_ended",
        "streaming",
    )

    def __init__(
        self,
        conn: ClientSide,
        method: str,
        target: bytes,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
        chunked: bool = True,
        received_at: float = 0.0,
    ) -> None:
        self._conn = conn
        self.chunked = chunked
        """The client speaks HTTP/1.1: a streamed body may use chunked transfer coding."""
        self._head = b""
        self.method = method
        path, _, query = target.partition(b"?")
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers
        """Header names lower-cased; a repeated header keeps its last value."""
        self.body = body
        self.keep_alive = keep_alive
        self.received_at = received_at
        """time.monotonic() when its last byte was read (a simulated replica's arrival)."""
        self.responded = False
        self.streaming = False
        self.stream_ended = False
        self.status = 0
        """The status answered (0 until then)."""

    @property
    def connected(self) -> bool:
        return not self._conn.closed

    @property
    def connection(self) -> ClientSide:
        """The client's connection: its `closed` and `paused` flags and its transport, for a
        relay that reads them per token (plain attributes, no call)."""
        return self._conn

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        """Write a whole response (with Content-Length)."""
        if self.responded:
            raise RuntimeError("this request was already answered")
        self.responded = True
        self.status = status
        head = [status_line(status), b"content-type: ", content_type, b"\r\ncontent-length: ",
                b"%d" % len(body), b"\r\n"]  # fmt: skip
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if self.method != "HEAD":  # RFC 9110 9.3.2: the answer to HEAD has no content
            head.append(body)
        self._conn.write(b"".join(head))

    def start_stream(
        self, status: int, content_type: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        """Write the head of a response whose body follows in chunks."""
        if self.responded:
            raise RuntimeError("this request was already answered")
        self.responded = self.streaming = True
        self.status = status
        if not self.chunked:
            self.keep_alive = False  # HTTP/1.0: the body ends where the connection does
        head = [status_line(status), b"content-type: ", content_type,
                b"\r\ncache-control: no-cache\r\n",
                b"transfer-encoding: chunked\r\n" if self.chunked else b""]  # fmt: skip
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        # Held back to leave with the first chunk: one write (one system call) instead of two.
        self._head = b"".join(head)

    def flush_head(self) -> None:
        """Write a held-back response head now (no body has come to carry it)."""
        if self._head:
            head, self._head = self._head, b""
            self._conn.write(head)

    def write_chunk(self, data: bytes) -> bool:
        """Write `data` as the next piece of the body; returns `write_paused` (in the same
        call: a relay asks it once per token)."""
        conn = self._conn
        if data:
            framed = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data
            conn.write(self._head + framed)
            self._head = b""
        else:
            self.flush_head()
        return conn.paused

    def write_framed(self, data: bytes) -> bool:
        """Write body bytes that already are in the chunked transfer coding (a replica's
        chunked body relayed as it came: where a call ends inside a chunk, the next goes on
        with it); the held-back head leaves with them. Only for a stream to an HTTP/1.1
        client (`chunked`). Returns `write_paused`."""
        conn = self._conn
        conn.write(self._head + data)
        self._head = b""
        return conn.paused

    def end_framed(self, data: bytes) -> None:
        """End a stream written with `write_framed`: `data` are its last bytes, in the
        chunked transfer coding and ending with its last chunk; later calls do nothing."""
        if self.stream_ended:
            return
        self.stream_ended = True
        head, self._head = self._head, b""
        self._conn.write(head + data)

    def end_stream(self, data: bytes = b"") -> None:
        """Write `data` as a last chunk (if any) and end the body; later calls do nothing."""
        if self.stream_ended:
            return
        self.stream_ended = True
        head, self._head = self._head, b""
        if not self.chunked:
            self._conn.write(head + data)
        elif data:
            self._conn.write(b"%b%x\r\n%b\r\n0\r\n\r\n" % (head, len(data), data))
        else:
            self._conn.write(head + LAST_CHUNK)

    @property
    def write_paused(self) -> bool:
        """The client reads slower than we write: stop feeding it until `wait_writable`."""
        return self._conn.paused

    async def wait_writable(self) -> None:
        await self._conn.wait_writable()

    def on_writable(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the client's socket buffer has drained (or it is closed)."""
        self._conn.writable_callbacks.append(callback)
