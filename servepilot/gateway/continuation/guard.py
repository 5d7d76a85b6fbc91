"""The proxy's side of continuation, per request: what its first replica's relay keeps, and
what becomes of the answer once that replica is done with it.

The proxy asks `guard_for` when a request arrives (None: the request is never continued,
and pays nothing more); each attempt's body and relay come from the guard, which keeps the
bytes relayed; `settle` hands an answer broken after its first token to the `Continuer`,
and makes a non-streamed answer (asked as a stream: continuation/whole.py) whole.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from servepilot.gateway.access_log import Trail
from servepilot.gateway.continuation.edge import CHAT_PATH, Attempt, Broken, Continuer
from servepilot.gateway.continuation.relay import CollectingRelay
from servepilot.gateway.continuation.whole import as_stream, assemble, plain, whole_events
from servepilot.gateway.relay import Outcome, Relay
from servepilot.gateway.replica import Replica
from servepilot.http1 import HttpRequest
from servepilot.http1.client import ClientConnection
from servepilot.routing.base import RequestView


def guard_for(
    continuer: Continuer, request: HttpRequest, path: str, doc: dict[str, Any], stream: bool
) -> Guard | None:
    """The guard of a request that may be continued; None for one that may not."""
    if not continuer.covers(request, path):
        return None
    chat = path == CHAT_PATH
    if stream:
        return Guard(continuer, request, doc, chat, whole=False)
    if continuer.whole_answers and plain(doc, chat=chat):
        return Guard(continuer, request, doc, chat, whole=True)
    return None


_JSON = b"application/json"
_TAIL_BYTES = 512  # the access log reads the usage from an answer's last bytes


class Guard:
    """One request that may be continued."""

    __slots__ = ("_continuer", "_doc", "_request", "chat", "record", "whole")

    def __init__(
        self,
        continuer: Continuer,
        request: HttpRequest,
        doc: dict[str, Any],
        chat: bool,
        *,
        whole: bool,
    ) -> None:
        self._continuer = continuer
        self._request = request
        self._doc = doc
        self.chat = chat
        self.whole = whole
        """A non-streamed answer, asked as a stream."""
        self.record: list[bytes] = []
        """The stream's body as it was sent to the client (as it came, when `whole`)."""

    def body(self, body: bytes) -> bytes:
        """The body an attempt sends, for the client's `body` (its own, or capped)."""
        if not self.whole:
            return body
        return as_stream(self._doc if body is self._request.body else json.loads(body))

    def relay(
        self, conn: ClientConnection, replica: Replica, loop: asyncio.AbstractEventLoop
    ) -> Relay:
        """The relay of an attempt on `replica` (a new attempt starts the record over: what
        a replica that failed before answering sent was nothing)."""
        self.record.clear()
        if self.whole:
            return CollectingRelay(self._request, conn, replica.header, loop, self.record)
        return Relay(self._request, conn, replica.header, loop, self.record)

    async def settle(
        self,
        outcome: Outcome,
        view: RequestView,
        tenant: str,
        replica_id: str,
        attempt: Attempt,
        trail: Trail | None,
    ) -> Outcome:
        """The answer's outcome once continued, when its stream broke after the first token
        (a stream past the request timeout has had all the time it may take)."""
        if outcome.streamed and outcome.failure is not None and not outcome.timed_out:
            outcome = await self._continued(outcome, view, tenant, replica_id, attempt, trail)
        if not self.whole or not outcome.streamed:
            return outcome
        # The client asked for one JSON answer, and has had nothing yet; as for any
        # non-streamed answer, no time to a first token is counted.
        if outcome.failure is not None:
            return replace(outcome, streamed=False, first_chunk_at=None)
        answer = assemble(b"".join(self.record), chat=self.chat)
        return replace(outcome, streamed=False, first_chunk_at=None, body=answer,
                       content_type=_JSON, tail=answer[-_TAIL_BYTES:])  # fmt: skip

    async def _continued(
        self,
        first: Outcome,
        view: RequestView,
        tenant: str,
        replica_id: str,
        attempt: Attempt,
        trail: Trail | None,
    ) -> Outcome:
        if self.whole:  # nothing reached the client: go on after the last whole event
            self.record[:] = [whole_events(b"".join(self.record))]
        broken = Broken(self._request, view, tenant, self._doc, self.chat, self.record,
                        replica_id, first, whole=self.whole)  # fmt: skip
        last = await self._continuer.carry_on(broken, attempt)
        if trail is not None and len(broken.used) > 1:
            trail.replicas = tuple(broken.used)
        # One answer: its first byte and token came with the first part, its bytes are all.
        return replace(last, ttfb_s=first.ttfb_s, first_chunk_at=first.first_chunk_at,
                       streamed_bytes=first.streamed_bytes + last.streamed_bytes)  # fmt: skip
