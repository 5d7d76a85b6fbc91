"""One client connection of the HTTP/1.1 server: an asyncio protocol over httptools (llhttp,
in C).

Requests on one connection are answered in order (pipelined requests wait their turn with the
socket paused). A client that disconnects cancels its handler, which is how an upstream
generation gets aborted. Malformed requests get a 400 and the connection closes; a body over
the limit gets a 413 before it is read, a request line and headers over theirs a 431. Those
early answers end with a lingering close (`_linger`), so that a client still sending its body
reads the answer instead of a reset. A request that sends `Expect: 100-continue` is told to
go on at once. Writes are never refused, but the request says when the client reads slower
than its answer comes (`write_paused`), so a handler can stop feeding it until the socket
drains.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import httptools

from servepilot.http1.errors import Disconnected, Rejected
from servepilot.http1.request import HttpRequest, status_line

if TYPE_CHECKING:
    from servepilot.http1.server import HttpServer

log = logging.getLogger(__name__)

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MALFORMED = "bad_http"


class HttpConnection(asyncio.Protocol):
    """One client connection: parse requests, run their handler one at a time."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._body_limit = (server.limits.max_body_bytes, "")
        self._max_head_bytes = server.limits.max_head_bytes
        self._pending: collections.deque[HttpRequest] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self.writable_callbacks: list[Callable[[], None]] = []
        self.closed = False
        self.paused = False
        self._rejected = False
        self._close_after = False
        self._current: HttpRequest | None = None
        self._declared_bytes: int | None = None
        self._linger_left_bytes = 0
        self._linger_timer: asyncio.TimerHandle | None = None

    @property
    def transport(self) -> asyncio.Transport | None:
        """The socket's transport (None until connected): its buffer size, its socket."""
        return self._transport

    @property
    def answering(self) -> asyncio.Task[None] | None:
        """The task answering the current request (None while the connection is idle)."""
        task = self._task
        # A task cancelled before it ever ran never reached `_handle`'s cleanup.
        return None if task is None or task.done() else task

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        # Looked up once per connection, not per request: on Python 3.11 every
        # get_running_loop() is a getpid() system call.
        self._loop = asyncio.get_running_loop()
        self._server.connections.add(self)

    @property
    def lingering(self) -> bool:
        """Closing after an early answer: reading and discarding what the client still sends."""
        return self._linger_timer is not None

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            if self._linger_timer is not None:
                self._discard(len(data))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported", "upgrade_not_supported")
        except httptools.HttpParserError as exc:
            if not self._rejected:
                self._reject(400, f"malformed HTTP request: {exc}", _MALFORMED)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._end_linger()
        self._server.connections.discard(self)
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # aborts whatever the handler is waiting on upstream
        self._wake_writers()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_writers()

    # --- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._head_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._declared_bytes = None

    # The head's size is counted inline in these two: a call less per header of every
    # request.

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > self._max_head_bytes:
            self._head_too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > self._max_head_bytes:
            self._head_too_large()
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        declared = self._headers.get("content-length")
        limits = self._server.limits
        if limits.uploads:  # otherwise the limit never changes: nothing to look up per request
            self._body_limit = limits.body_limit(self._url.partition(b"?")[0])
        if declared is not None and declared.isdigit():
            self._declared_bytes = int(declared)
        if self._declared_bytes is not None and self._declared_bytes > self._body_limit[0]:
            self._reject_large()
        elif self._headers.get("expect", "").lower() == "100-continue" and self._task is None:
            # Not while an earlier pipelined request is being answered: the interim response
            # would land inside that answer. The client sends its body after a short wait.
            self.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._body_limit[0]:
            self._reject_large()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._rejected:
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = HttpRequest(
            self,
            self._parser.get_method().decode("latin-1"),
            self._url,
            self._headers,
            body,
            self._parser.should_keep_alive() and not self._server.closing,
            self._parser.get_http_version() != "1.0",
            time.monotonic(),
        )
        if self._task is None:
            self._run(request)
        else:
            # Pipelined: answer in order; stop reading until this one's turn comes.
            self._pending.append(request)
            if self._transport is not None:
                self._transport.pause_reading()

    # --- running handlers -----------------------------------------------------------------

    def _run(self, request: HttpRequest) -> None:
        self._current = request
        loop = self._loop or asyncio.get_running_loop()
        self._task = loop.create_task(self._handle(request))

    async def _handle(self, request: HttpRequest) -> None:
        # What comes after the answer (`_finished`) runs at the end of this coroutine, not
        # as the task's done callback: one turn of the event loop less per request.
        cancelled = False
        try:
            await self._server.handler(request)
        except asyncio.CancelledError:
            cancelled = True
            if not self.closed:
                self.abort()  # cancelled by shutdown: the response is cut, so is the socket
            raise
        except Exception:
            log.exception("unexpected error answering %s %s", request.method, request.path)
            if request.responded:
                self.abort()
            else:
                self._answer_failure(request, "the server failed to handle this request")
            return
        else:
            if not request.responded:
                self._answer_failure(request, "the server did not answer this request")
        finally:
            self._finished(cancelled)

    def _answer_failure(self, request: HttpRequest, message: str) -> None:
        request.respond(500, self._server.error_body(500, message, "internal_error"))

    def _finished(self, cancelled: bool) -> None:
        request, self._task, self._current = self._current, None, None
        if self.closed or self._transport is None:
            return
        keep_alive = request is not None and request.keep_alive and not self._close_after
        if self._rejected and not cancelled:
            self._linger()  # the rejected request's body may still be on its way
            return
        if self._server.closing or cancelled or not keep_alive:
            self._transport.close()
            self.closed = True
            return
        if self._pending:
            self._run(self._pending.popleft())
            if not self._pending:
                self._transport.resume_reading()

    # --- writing --------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.closed or self._transport is None:
            raise Disconnected("the client closed the connection")
        self._transport.write(data)

    async def wait_writable(self) -> None:
        if not self.paused or self.closed:
            return
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()
        await self._writable

    def _wake_writers(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        callbacks, self.writable_callbacks = self.writable_callbacks, []
        for callback in callbacks:
            callback()

    def _head_too_large(self) -> None:
        self._reject(431, "the request line and headers are too large", "headers_too_large")

    def _reject_large(self) -> None:
        limit, setting = self._body_limit
        message = f"the request body is larger than {limit} bytes{setting}"
        self._reject(413, message, "body_too_large")

    def _reject(self, status: int, message: str, code: str) -> None:
        """Answer a request that cannot be parsed or accepted, then close the connection."""
        if self._rejected or self.closed or self._transport is None:
            return
        self._rejected = True
        body = self._server.error_body(status, message, code)
        sent = self._task is None  # otherwise the running handler's response comes first
        if sent:
            self._transport.write(
                status_line(status) + b"content-type: application/json\r\ncontent-length: "
                + b"%d\r\nconnection: close\r\n\r\n" % len(body) + body
            )  # fmt: skip
            self._linger()
        else:
            self._pending.clear()
            self._close_after = True
        self._server.rejected(self._refusal(status, code, len(body) if sent else None))

    def _refusal(self, status: int, code: str, answer_bytes: int | None) -> Rejected:
        """What is known of a refused request. A malformed one's request line may not have
        been read, and what was parsed may be a previous request's: none of it is told."""
        method = path = None
        if code != _MALFORMED and self._url:
            method = self._parser.get_method().decode("latin-1")
            path = self._url.partition(b"?")[0].decode("latin-1")
        return Rejected(status, code, method, path, self._body_bytes, answer_bytes)

    def _linger(self) -> None:
        """Close after an early answer without losing it. Closing a socket whose receive
        buffer holds unread bytes makes the kernel send a reset, which can destroy the answer
        before the client reads it (a client that writes its whole body before reading, as
        Python's urllib does, then sees "connection reset" instead of the 413). So: send the
        answer, shut down the write side, and read and discard until the client closes, the
        declared body has come, `Limits.linger_max_bytes` were read or `Limits.linger_s`
        passed; then close. A timer, not a task: nothing outlives the connection."""
        transport = self._transport
        self.closed = True
        if transport is None or self._linger_timer is not None:
            return
        limits = self._server.limits
        declared = self._declared_bytes
        budget = limits.linger_max_bytes if declared is None else declared - self._body_bytes
        self._linger_left_bytes = min(max(budget, 0), limits.linger_max_bytes)
        if self._linger_left_bytes == 0 or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # sent after the answer: the client reads it, then EOF
        transport.resume_reading()  # paused if pipelined requests were waiting their turn
        loop = asyncio.get_running_loop()
        self._linger_timer = loop.call_later(limits.linger_s, self._stop_lingering)
        self._server.lingering += 1

    def _discard(self, size: int) -> None:
        self._linger_left_bytes -= size
        if self._linger_left_bytes <= 0:
            self._stop_lingering()

    def _stop_lingering(self) -> None:
        self._end_linger()
        if self._transport is not None:
            self._transport.close()

    def _end_linger(self) -> None:
        timer, self._linger_timer = self._linger_timer, None
        if timer is not None:
            timer.cancel()
            self._server.lingering -= 1

    def abort(self) -> None:
        """Cut the connection at once, unsent bytes and all."""
        if self._transport is not None:
            self._transport.abort()
        self.closed = True

    def close_idle(self) -> None:
        """Close the connection if no request is being answered (server shutdown)."""
        if self._task is None and self._transport is not None and not self.closed:
            self._transport.close()
            self.closed = True
