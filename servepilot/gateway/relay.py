"""One upstream attempt: send the request bytes to a replica and relay its answer.

A `Relay` is the `Sink` of one exchange. A streamed answer (HTTP 200, text/event-stream) is
written to the client as it arrives, piece by piece, from the upstream connection's callbacks;
any other answer is collected and handed back whole, so that the proxy can turn a replica's
5xx into a 502 of its own. The proxy awaits `done` only once per attempt.

A stream is complete when its last event, `data: [DONE]`, has been relayed, not when the
replica's chunked body ends: vLLM (uvicorn) writes that end separately, and the `openai` client
closes its connection as soon as it has read `[DONE]`. So the client's stream is ended with the
`[DONE]` event, in the same write, and `done` resolves there; the end of the replica's body is
still read, to keep its connection for the next request (`ClientConnection.drain`).

Passthrough: when the client speaks HTTP/1.1 and the replica's stream is chunked (vLLM's is),
the replica's bytes already are the chunked body the client must get. They are then written
as they were read (`ClientConnection.pass_through`, `HttpRequest.write_framed`): no
re-framing, and per token one call into the relay, which writes to the socket itself. The
parser still reads every byte; its pieces of body are what the relay looks at for `[DONE]`,
the byte count and the tail, so that nothing but the chunk framing differs from a re-framed
stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from mypy_extensions import mypyc_attr

from servepilot.http1 import HttpRequest
from servepilot.http1.client import ClientConnection
from servepilot.http1.errors import UpstreamFailed

_EVENT_STREAM = b"text/event-stream"
_LAST_EVENT = b"data: [DONE]\n\n"
_LAST_LEN = len(_LAST_EVENT)
ERROR_EVENT = b'data: {"error"'
"""How vLLM's error event starts (its engine failed mid-answer: the stream ends with it)."""
_CHUNKED_END = b"\r\n0\r\n\r\n"
"""What ends a chunked body after the data of its last chunk: that chunk's CRLF, then the
last chunk (size 0) and the empty trailer."""
_EVENT_END = b"\n\n\r\n"
"""A passed-through read that ends so ends a chunk (an SSE event, then the chunk's CRLF)."""
# An OpenAI answer's `usage` is in its last few hundred bytes (the last event of a stream
# asked with include_usage comes just before [DONE]).
_TAIL_BYTES = 512


def _end_of(read: bytes, last: bytes) -> int:
    """Where `last`, the last piece of body of a read as it came, ends in it: after it come
    no more than the CRLF of its chunk and the start of the body's end (`_CHUNKED_END`). A
    search for the piece alone could stop inside that framing (a piece may be one `\n`)."""
    for framing in range(len(_CHUNKED_END) - 1, -1, -1):
        end = len(read) - framing
        if read.endswith(_CHUNKED_END[:framing]) and read.endswith(last, 0, end):
            return end
    return read.rfind(last) + len(last)


@dataclass(slots=True)
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

    def __init__(
        self,
        status: int,
        streamed: bool,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        failure: UpstreamFailed | None = None,
        retryable: bool = False,
        timed_out: bool = False,
        ttfb_s: float = 0.0,
        first_chunk_at: float | None = None,
        streamed_bytes: int = 0,
        tail: bytes = b"",
    ) -> None:
        # The dataclass's __init__, written out, one per request: a frozen dataclass's sets
        # each field through object.__setattr__ (and, compiled, stays interpreted): about
        # 17,000 instructions, against a few hundred for plain stores. So it is not frozen;
        # nothing changes an outcome once built (`dataclasses.replace` makes a new one), and
        # a test holds these defaults to the fields'.
        self.status = status
        self.streamed = streamed
        self.body = body
        self.content_type = content_type
        self.failure = failure
        self.retryable = retryable
        self.timed_out = timed_out
        self.ttfb_s = ttfb_s
        self.first_chunk_at = first_chunk_at
        self.streamed_bytes = streamed_bytes
        self.tail = tail


class ReplicaErrorEvent(UpstreamFailed):
    """A replica ended a stream with an error event (its engine failed mid-answer)."""


# Compiled (core/accel.py), a class is closed to Python subclasses unless it says otherwise;
# the hot-path tests count the relay's calls through one.
@mypyc_attr(allow_interpreted_subclasses=True)
class Relay:
    """Relays one exchange; `done` resolves to its `Outcome`."""

    __slots__ = (
        "_client", "_conn", "_content_type", "_first_chunk_s", "_head_s", "_last", "_parts",
        "_pieces", "_previous", "_raw", "_record", "_relayed", "_replica_header", "_request",
        "_send", "_sent_s", "_status", "_streaming", "_written", "done",
    )  # fmt: skip

    def __init__(
        self,
        request: HttpRequest,
        conn: ClientConnection,
        replica_header: tuple[bytes, bytes],
        loop: asyncio.AbstractEventLoop,
        record: list[bytes] | None = None,
    ) -> None:
        """`record`: where to keep the stream's body as sent (for continuing it elsewhere
        should the replica fail: gateway/continuation)."""
        self._request = request
        self._record = record
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
        self._raw = False
        """The stream is passed through (see the module's doc)."""
        self._client = request.connection
        self._pieces: list[bytes] = []
        self._send: Callable[[bytes], object] | None = None
        """The client socket's own write, once the head has gone (passthrough)."""
        self._written = b""
        """The last read passed through."""
        self.done: asyncio.Future[Outcome] = loop.create_future()

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self._head_s = time.perf_counter()
        self._status = status
        self._content_type = headers.get(b"content-type", b"application/json")
        if status == 200 and self._content_type.startswith(_EVENT_STREAM):
            self._streaming = True
            request = self._request
            if request.connected:
                request.start_stream(200, self._content_type, (self._replica_header,))
                if request.chunked and self._conn.pass_through():
                    self._raw = True
                    self._pieces = self._conn.pieces

    def on_read(self, data: bytes) -> None:
        # Once per upstream read, so once per token of a replica that writes each token
        # alone (vLLM): the hot path of a stream, kept to this one call.
        if not self._raw:
            self._on_body(data)
            return
        request = self._request
        if self._client.closed or request.stream_ended:
            return  # the handler is being cancelled, or the rest after [DONE] is drained
        pieces = self._pieces
        if pieces:
            if self._first_chunk_s is None:
                self._first_chunk_s = time.perf_counter()
            last = pieces[-1]
            if last.endswith(_LAST_EVENT) or (len(last) < _LAST_LEN and self._ends_stream(last)):
                self._complete(data)
                return
            record = self._record
            if record is not None and last.startswith(ERROR_EVENT):
                self._engine_failed(last)  # a stream that may be continued is, instead
                return
            self._relayed += len(last) if len(pieces) == 1 else sum(map(len, pieces))
            self._previous = last
            if record is not None:
                record.extend(pieces)
        self._written = data
        send = self._send
        if send is None:  # the held-back head leaves with the first bytes
            paused = request.write_framed(data)
            transport = self._client.transport
            assert transport is not None
            self._send = transport.write
        else:
            send(data)
            paused = self._client.paused
        if paused:
            self._slow_client()

    def _on_body(self, data: bytes) -> None:
        """A read's body bytes, of an answer not passed through (collected, or re-framed to
        the client)."""
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
        if self._record is not None and data.startswith(ERROR_EVENT):
            self._engine_failed(data)
            return
        self._relayed += len(data)
        self._previous = data
        if self._record is not None:
            self._record.append(data)
        if request.write_chunk(data):
            self._slow_client()

    def _slow_client(self) -> None:
        """The client reads slower than the replica writes: stop reading upstream until the
        client catches up, instead of buffering the whole answer here."""
        self._conn.pause_reading()
        self._request.on_writable(self._conn.resume_reading)

    def on_end(self, data: bytes) -> None:
        request = self._request
        if self._record is not None and self._streaming:
            last = b"".join(self._pieces) if self._raw else data
            at = last.find(ERROR_EVENT)
            if at >= 0:  # the error event came with the end of the body
                self._engine_failed(last[at:])
                return
        if self._raw:
            pieces = self._pieces
            if pieces and self._first_chunk_s is None:
                self._first_chunk_s = time.perf_counter()
            if request.connected and not request.stream_ended:
                # The last events and the replica's end of the body leave in one write.
                self._last = b"".join(pieces)
                request.end_framed(data)
                self._relayed += len(self._last)
        elif self._streaming:
            if self._first_chunk_s is None and data:
                self._first_chunk_s = time.perf_counter()
            if request.connected:
                # The last events and the end of the stream leave in one write.
                self._last = data
                request.end_stream(data)
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
        before the client can react to it by closing its connection. Passed through, `data`
        is the read as it came: it goes up to the end of `[DONE]`, then the end of the body
        is ours (what came of the replica's own after `[DONE]` is left to the drain)."""
        if self._record is not None:
            # vLLM ends a stream whose engine failed with its error event and then [DONE]:
            # read together, the stream is not whole but given up on (continued elsewhere).
            read = b"".join(self._pieces) if self._raw else data
            at = read.find(ERROR_EVENT)
            if at >= 0:
                self._engine_failed(read[at:])
                return
        if self._raw:
            pieces = self._pieces
            self._request.end_framed(data[: _end_of(data, pieces[-1])] + _CHUNKED_END)
            data = b"".join(pieces)
        else:
            self._request.end_stream(data)
        self._relayed += len(data)
        self._last = data
        self._conn.drain()
        if not self.done.done():
            self.done.set_result(self._outcome())

    def on_failure(self, exc: UpstreamFailed, answered: bool) -> None:
        if self.done.done():
            return
        self._cut_inside_chunk()
        self.done.set_result(self._outcome(exc, answered))

    def expire(self) -> None:
        """The request timeout passed: abandon the exchange (never retried elsewhere: the
        replica may still be working on it)."""
        if self.done.done():
            return
        self._conn.abort()
        self._cut_inside_chunk()
        failure = UpstreamFailed("no complete answer within the request timeout")
        self.done.set_result(replace(self._outcome(failure, answered=True), timed_out=True))

    def abandon(self, failure: UpstreamFailed) -> None:
        """Give up on the replica mid-answer (it stalled, or left the rotation): the
        stream may go on elsewhere (gateway/continuation); one it had not answered at all
        may be retried elsewhere."""
        if self.done.done():
            return
        self._conn.abort()
        self._cut_inside_chunk()
        self.done.set_result(self._outcome(failure, answered=self._status != 0))

    def _engine_failed(self, event: bytes) -> None:
        """The replica's error event, mid-answer: not relayed, the stream is given up on it
        (the proxy continues it elsewhere)."""
        if self.done.done():
            return
        self._conn.abort()
        self._cut_inside_chunk()
        said = event[len(b"data: ") : 300].decode("utf-8", "replace").strip()
        failure = ReplicaErrorEvent(f"the replica sent an error event: {said}")
        self.done.set_result(self._outcome(failure, answered=True))

    def progress(self) -> int:
        """Body bytes relayed so far; -1 before the first chunk."""
        return -1 if self._first_chunk_s is None else self._relayed

    def _cut_inside_chunk(self) -> None:
        """A stream passed through that stops where a read ended inside a chunk: the client
        could not read an error event written after it, so its connection is cut (its
        client sees a broken stream, as it is). Reads end where the replica's writes do,
        after whole events, all but always."""
        written = self._written
        if self._raw and written and not written.endswith(_EVENT_END):
            self._client.abort()

    def outcome_so_far(self) -> Outcome:
        """How far the exchange got (for the log line of a request whose client left)."""
        return self._outcome()

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
