"""Where the engine's tokens go: the HTTP answer of one request (realtime.TokenSink).

A stream writes each token's event as the engine's step loop makes it: one write, no task
switch. When the client reads slower than tokens come (its connection's buffer is past the
high-water mark), the sink stops writing and keeps only the count of tokens made: an event is
rendered from its index, so a slow client costs an integer rather than a growing buffer. Once
the socket drains, the events left go out in batches until the buffer fills again. The
engine never waits for a client (vLLM's does not either).

Each sink resolves `answered` once its answer is written, which ends the request's handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from servepilot.http1 import HttpRequest

_BATCH_TOKENS = 32
"""Events per write while catching up: few system calls, and a buffer that stays bounded."""


class EventFormat(Protocol):
    """The bytes of a stream's events (openai_api.StreamFormat, responses_api.ResponseFormat)."""

    def token(self, index: int) -> bytes: ...

    def end(self) -> bytes: ...


class StreamSink:
    """Writes each token's SSE event, holding back what a slow client cannot take yet."""

    __slots__ = (
        "_answered", "_drop_after", "_finished", "_format", "_made", "_request", "_sent",
        "_waiting",
    )  # fmt: skip

    def __init__(
        self,
        request: HttpRequest,
        fmt: EventFormat,
        answered: asyncio.Future[None],
        drop_after: int | None = None,
    ) -> None:
        """`drop_after`: cut the connection once this many tokens are written (a replica
        dying mid-answer, for tests)."""
        self._request = request
        self._drop_after = drop_after
        self._format = fmt
        self._answered = answered
        self._made = 0
        self._sent = 0
        self._finished = False
        self._waiting = False
        """Writes are held until the client's socket drains."""

    def token(self, index: int) -> None:
        self._made = index + 1
        if self._waiting:
            return
        request = self._request
        if index == self._sent and request.connected and not request.write_paused:
            self._sent = self._made  # the usual case: this token's event, at once
            request.write_chunk(self._format.token(index))
            if self._made == self._drop_after:
                request.connection.abort()  # the handler is cancelled: the request leaves
        else:
            self._send()

    def finish(self) -> None:
        self._finished = True
        if not self._waiting:
            self._send()

    def _resume(self) -> None:
        self._waiting = False
        self._send()

    def _send(self) -> None:
        """Write what is made and unsent, until the client's buffer is full; then wait."""
        request, fmt = self._request, self._format
        while request.connected and not request.write_paused:
            end = min(self._made, self._sent + _BATCH_TOKENS)
            events = b"".join([fmt.token(i) for i in range(self._sent, end)])
            self._sent = end
            if self._finished and end == self._made:
                request.end_stream(events + fmt.end())
                _resolve(self._answered)
                return
            if not events:
                return
            request.write_chunk(events)
        if request.connected:
            self._waiting = True
            request.on_writable(self._resume)
        # A client that left cancels the handler, which takes the request out of the engine.


class WholeSink:
    """Answers once the last token is generated, with the bytes `render` makes then."""

    __slots__ = ("_answered", "_render", "_request")

    def __init__(
        self, request: HttpRequest, render: Callable[[], bytes], answered: asyncio.Future[None]
    ) -> None:
        self._request = request
        self._render = render
        self._answered = answered

    def token(self, index: int) -> None:
        pass

    def finish(self) -> None:
        if self._request.connected:
            self._request.respond(200, self._render())
        _resolve(self._answered)


def _resolve(answered: asyncio.Future[None]) -> None:
    if not answered.done():  # a client that left has cancelled it
        answered.set_result(None)
