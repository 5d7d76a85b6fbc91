"""The relays of an answer that may be continued, beyond the base relay's.

`ContinuationRelay`: the client's stream is already open, so the replica's events are
rewritten (`Splicer`) and written on as more of the same answer (or, for a non-streamed
answer, kept with the first part's). An answer other than a stream (the replica refused
the continuation) is collected whole, as the base relay does.

`CollectingRelay`: the first part of a non-streamed answer asked as a stream
(continuation/whole.py): its events are kept, none is written to the client.
"""

from __future__ import annotations

import asyncio
import time

from servepilot.gateway.continuation.splice import Splicer
from servepilot.gateway.relay import ERROR_EVENT, Relay
from servepilot.http1 import HttpRequest
from servepilot.http1.client import ClientConnection
from servepilot.http1.errors import UpstreamFailed

_EVENT_STREAM = b"text/event-stream"
_LAST_EVENT = b"data: [DONE]\n\n"


class ContinuationRelay(Relay):
    __slots__ = ("_kept", "splicer")

    def __init__(
        self,
        request: HttpRequest,
        conn: ClientConnection,
        replica_header: tuple[bytes, bytes],
        loop: asyncio.AbstractEventLoop,
        splicer: Splicer,
        kept: list[bytes] | None = None,
    ) -> None:
        """`kept`: where the events go instead of the client (a non-streamed answer)."""
        super().__init__(request, conn, replica_header, loop)
        self.splicer = splicer
        self._kept = kept

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        _note_head(self, status, headers)
        self._head_s = self._sent_s  # the client had its head long ago

    def on_read(self, data: bytes) -> None:
        if not self._streaming:
            self._on_body(data)
            return
        request = self._request
        if not request.connected or request.stream_ended:
            return
        if self._first_chunk_s is None:  # from here a silence is a stall (watchdog)
            self._first_chunk_s = time.perf_counter()
        out = self.splicer.feed(data)
        if self.splicer.done:
            self._finish_stream(out)
            self._conn.drain()
            return
        if out:
            self._relayed += len(out)
            self._previous = out
            if self._kept is not None:
                self._kept.append(out)
            elif request.write_chunk(out):
                self._slow_client()
        if self.splicer.error is not None:
            self._engine_failed(self.splicer.error.encode())

    def on_end(self, data: bytes) -> None:
        if not self._streaming:
            super().on_end(data)
            return
        out = self.splicer.feed(data) if data else b""
        if self.splicer.done:
            self._finish_stream(out)
        elif self.splicer.error is not None:
            if out and self._kept is not None:
                self._kept.append(out)
            elif out and self._request.connected:
                self._request.write_chunk(out)
            self._engine_failed(self.splicer.error.encode())
        elif not self.done.done():
            # The body ended without [DONE]: what came is relayed, the rest is the proxy's.
            if out and self._request.connected:
                self._relayed += len(out)
                if self._kept is not None:
                    self._kept.append(out)
                else:
                    self._request.write_chunk(out)
            self.done.set_result(self._outcome())

    def _finish_stream(self, out: bytes) -> None:
        request = self._request
        if self._kept is not None:
            self._kept.append(out)
        elif request.connected:
            request.end_stream(out)
        self._relayed += len(out)
        self._last = out
        if not self.done.done():
            self.done.set_result(self._outcome())


class CollectingRelay(Relay):
    __slots__ = ("_kept",)

    def __init__(
        self,
        request: HttpRequest,
        conn: ClientConnection,
        replica_header: tuple[bytes, bytes],
        loop: asyncio.AbstractEventLoop,
        kept: list[bytes],
    ) -> None:
        super().__init__(request, conn, replica_header, loop)
        self._kept = kept

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        _note_head(self, status, headers)

    def on_read(self, data: bytes) -> None:
        if not self._streaming:
            self._on_body(data)
            return
        if not data:
            return
        if self._first_chunk_s is None:  # from here a silence is a stall (watchdog)
            self._first_chunk_s = time.perf_counter()
        if data.startswith(ERROR_EVENT):
            self._engine_failed(data)
            return
        self._kept.append(data)
        self._relayed += len(data)
        # [DONE] may be split between reads: the last two are enough to see it.
        ended = (self._previous + data).endswith(_LAST_EVENT)
        self._previous = data
        if ended:
            self._conn.drain()
            if not self.done.done():
                self.done.set_result(self._outcome())

    def on_end(self, data: bytes) -> None:
        if not self._streaming:
            super().on_end(data)
            return
        if (at := data.find(ERROR_EVENT)) >= 0:
            self._engine_failed(data[at:])
            return
        if data:
            self._kept.append(data)
            self._relayed += len(data)
        if not self.done.done():
            ended = b"".join(self._kept[-2:]).endswith(_LAST_EVENT)
            failure = None if ended else UpstreamFailed("the answer ended before its last event")
            self.done.set_result(self._outcome(failure))


def _note_head(relay: Relay, status: int, headers: dict[bytes, bytes]) -> None:
    """What the base relay notes of the head, less starting the client's stream (already
    started, or none to start)."""
    relay._head_s = time.perf_counter()
    relay._status = status
    relay._content_type = headers.get(b"content-type", b"application/json")
    relay._streaming = status == 200 and relay._content_type.startswith(_EVENT_STREAM)
