"""The proxy's side of continuation, per request: what its first replica's relay keeps, and
what becomes of the answer once that replica is done with it.

The proxy asks the `Continuer` for a `Guard` when a request arrives (none: the request is
never continued, and pays nothing more); each attempt's relay comes from the guard, which
keeps the bytes relayed; `settle` hands an answer broken after its first token to the
`Continuer`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from servepilot.gateway.access_log import Trail
from servepilot.gateway.continuation.edge import CHAT_PATH, Attempt, Broken, Continuer
from servepilot.gateway.relay import Outcome, Relay
from servepilot.gateway.replica import Replica
from servepilot.http1 import HttpRequest
from servepilot.http1.client import ClientConnection
from servepilot.routing.base import RequestView


class Guard:
    """One request that may be continued."""

    __slots__ = ("_continuer", "_doc", "_request", "chat", "record")

    def __init__(
        self, continuer: Continuer, request: HttpRequest, path: str, doc: dict[str, Any]
    ) -> None:
        self._continuer = continuer
        self._request = request
        self._doc = doc
        self.chat = path == CHAT_PATH
        self.record: list[bytes] = []
        """The stream's body as it was sent to the client."""

    def relay(
        self, conn: ClientConnection, replica: Replica, loop: asyncio.AbstractEventLoop
    ) -> Relay:
        """The relay of an attempt on `replica` (a new attempt starts the record over: what
        a replica that failed before answering sent was nothing)."""
        self.record.clear()
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
        if not outcome.streamed or outcome.failure is None or outcome.timed_out:
            return outcome
        broken = Broken(self._request, view, tenant, self._doc, self.chat, self.record,
                        replica_id, outcome)  # fmt: skip
        last = await self._continuer.carry_on(broken, attempt)
        # One answer: its first byte and token came with the first part, its bytes are all.
        merged = replace(last, ttfb_s=outcome.ttfb_s, first_chunk_at=outcome.first_chunk_at,
                         streamed_bytes=outcome.streamed_bytes + last.streamed_bytes)  # fmt: skip
        if trail is not None and len(broken.used) > 1:
            trail.replicas = tuple(broken.used)
        return merged
