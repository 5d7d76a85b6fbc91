"""One upstream attempt: send the request bytes to a replica and relay its answer.

A `Relay` is the `Sink` of one exchange. A streamed answer (HTTP 200, text/event-stream) is
written to the client as it arrives, piece by piece, from the upstream connection's callbacks;
any other answer is collected and handed back whole, so that the proxy can turn a replica's
5xx into a 502 of its own. The proxy awaits `done` only once per attempt.

A stream is complete when its last event, `data: [DONE]`, has been relayed, not when the
replica's chunked body ends: vLLM (uvicorn) writes that end separately, and the `openai` client
closes its connection as soon as it has read `[DONE]`. So the client's stream is ended with the
`[DONE]` event, in the same write, and `done` resolves there; the end of the replica's body is
still read, to keep its connection for the next request (`UpstreamConnection.drain`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from servepilot.gateway.upstream import UpstreamConnection, UpstreamFailed
from servepilot.http1 import HttpRequest

_EVENT_STREAM = b"text/event-stream"
_LAST_EVENT = b"data: [DONE]\n\n"
_LAST_LEN = len(_LAST_EVENT)
# An OpenAI answer's `usage` is in its last few hundred bytes (the last event of a stream
# asked with include_usage comes just before [DONE]).
_TAIL_BYTES = 512


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an attempt ended."""

    status: int
    """The replica's HTTP status (0 when it never answered)."""
    streamed: bool
    """The answer went to the client as a stream (already written)."""
    body: bytes = b""
    """The whole body of an answer that was not streamed."""
    content_type: bytes = b"application/json"
    failure: UpstreamFailed | None = None
    retryable: bool = False
    """The failure came before any byte of the answer: another replica may be tried."""
    timed_out: bool = False
    ttfb_s: float = 0.0
    """Upstream time to first byte (response head)."""
    first_chunk_at: float | None = None
    """`time.perf_counter()` when the first streamed body chunk arrived."""
    streamed_bytes: int = 0
    """Body bytes of a streamed answer written to the client."""
    tail: bytes = b""
    """The last bytes of the answer (where its `usage` is), for the access log."""


class Relay:
    """Relays one exchange; `done` resolves to its `Outcome`."""

    __slots__ = (
        "_conn", "_content_type", "_first_chunk_s", "_head_s", "_last", "_parts", "_previous",
        "_relayed", "_replica_header", "_request", "_sent_s", "_status", "_streaming", "done",
    )  # fmt: skip

    def __init__(
        self,
        request: HttpRequest,
        conn: UpstreamConnection,
        replica_header: tuple[bytes, bytes],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._request = request
        self._conn = conn
        self._replica_header = replica_header
        self._status = 0
        self._streaming = False
        self._content_type = b"application/json"
        self._parts: list[bytes] = []
        self._previous = b""  # the last piece written to the client
        self._last = b""  # the stream's final piece
        self._relayed = 0
        self._sent_s = time.perf_counter()
        self._head_s = 0.0
        self._first_chunk_s: float | None = None
        self.done: asyncio.Future[Outcome] = loop.create_future()

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self._head_s = time.perf_counter()
        self._status = status
        self._content_type = headers.get(b"content-type", b"application/json")
        if status == 200 and self._content_type.startswith(_EVENT_STREAM):
            self._streaming = True
            if self._request.connected:
                self._request.start_stream(200, self._content_type, (self._replica_header,))

    def on_read(self, data: bytes) -> None:
        # Once per upstream read, so once per token of a replica that writes each token
        # alone (vLLM): the hot path of a stream.
        if not self._streaming:
            if data:
                self._parts.append(data)
            return
        request = self._request
        if not data:
            if request.connected:
                request.flush_head()
            return
        if self._first_chunk_s is None:
            self._first_chunk_s = time.perf_counter()
        if not request.connected:
            return  # the handler is being cancelled and will drop the connection
        if data.endswith(_LAST_EVENT) or (len(data) < _LAST_LEN and self._ends_stream(data)):
            self._complete(data)
            return
        self._relayed += len(data)
        self._previous = data
        if request.write_chunk(data):
            # The client reads slower than the replica writes: stop reading upstream until
            # the client catches up, instead of buffering the whole answer here.
            self._conn.pause_reading()
            request.on_writable(self._conn.resume_reading)

    def on_end(self, data: bytes) -> None:
        if self._streaming:
            if self._first_chunk_s is None and data:
                self._first_chunk_s = time.perf_counter()
            if self._request.connected:
                # The last events and the end of the stream leave in one write.
                self._last = data
                self._request.end_stream(data)
                self._relayed += len(data)
        elif data:
            self._parts.append(data)
        if not self.done.done():
            self.done.set_result(self._outcome())

    def _ends_stream(self, data: bytes) -> bool:
        """`data`, shorter than the last event, ends with the rest of one that began in the
        read before (a read boundary may fall anywhere)."""
        missing = len(_LAST_EVENT) - len(data)
        return (
            missing > 0
            and _LAST_EVENT.endswith(data)
            and self._previous.endswith(_LAST_EVENT[:missing])
        )

    def _complete(self, data: bytes) -> None:
        """The stream's last event came before the end of the replica's body: the answer is
        whole, so the client's stream ends now (one write) and the exchange counts as done
        before the client can react to it by closing its connection."""
        self._request.end_stream(data)
        self._relayed += len(data)
        self._last = data
        self._conn.drain()
        if not self.done.done():
            self.done.set_result(self._outcome())

    def on_failure(self, exc: Exception, answered: bool) -> None:
        if self.done.done():
            return
        failure = exc if isinstance(exc, UpstreamFailed) else UpstreamFailed(str(exc))
        self.done.set_result(self._outcome(failure, answered))

    def expire(self) -> None:
        """The request timeout passed: abandon the exchange (never retried elsewhere: the
        replica may still be working on it)."""
        if self.done.done():
            return
        self._conn.abort()
        failure = UpstreamFailed("no complete answer within the request timeout")
        self.done.set_result(replace(self._outcome(failure, answered=True), timed_out=True))

    def _outcome(self, failure: UpstreamFailed | None = None, answered: bool = True) -> Outcome:
        sent = self._sent_s
        body = b"".join(self._parts)
        if self._streaming:
            tail = self._previous[-_TAIL_BYTES:] + self._last[-_TAIL_BYTES:]
        else:
            tail = body[-_TAIL_BYTES:]
        return Outcome(
            status=self._status,
            streamed=self._streaming,
            body=body,
            content_type=self._content_type,
            failure=failure,
            retryable=failure is not None and not answered,
            ttfb_s=(self._head_s - sent) if self._head_s else 0.0,
            first_chunk_at=self._first_chunk_s,
            streamed_bytes=self._relayed,
            tail=tail,
        )
