"""The relay of a continuation: the client's stream is already open, so the replica's events
are rewritten (`Splicer`) and written on as more of the same answer. An answer other than a
stream (the replica refused the continuation) is collected whole, as the base relay does."""

from __future__ import annotations

import asyncio
import time

from servepilot.gateway.continuation.splice import Splicer
from servepilot.gateway.relay import Relay
from servepilot.http1 import HttpRequest
from servepilot.http1.client import ClientConnection

_EVENT_STREAM = b"text/event-stream"


class ContinuationRelay(Relay):
    __slots__ = ("splicer",)

    def __init__(
        self,
        request: HttpRequest,
        conn: ClientConnection,
        replica_header: tuple[bytes, bytes],
        loop: asyncio.AbstractEventLoop,
        splicer: Splicer,
    ) -> None:
        super().__init__(request, conn, replica_header, loop)
        self.splicer = splicer

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self._head_s = self._sent_s  # the client had its head long ago
        self._status = status
        self._content_type = headers.get(b"content-type", b"application/json")
        self._streaming = status == 200 and self._content_type.startswith(_EVENT_STREAM)

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
            if request.write_chunk(out):
                self._slow_client()

    def on_end(self, data: bytes) -> None:
        if not self._streaming:
            super().on_end(data)
            return
        out = self.splicer.feed(data) if data else b""
        if self.splicer.done:
            self._finish_stream(out)
        elif not self.done.done():
            # The body ended without [DONE]: what came is relayed, the rest is the proxy's.
            if out and self._request.connected:
                self._relayed += len(out)
                self._request.write_chunk(out)
            self.done.set_result(self._outcome())

    def _finish_stream(self, out: bytes) -> None:
        request = self._request
        if request.connected:
            request.end_stream(out)
        self._relayed += len(out)
        self._last = out
        if not self.done.done():
            self.done.set_result(self._outcome())
