"""Sending one batch line through the gateway's own inference route, in process.

The line becomes a request of the proxy's like any client's, at priority 2: the same
validation, admission (queues, budgets, shedding), routing, retries and metrics as online
traffic, without a socket or a second HTTP parse. Its answer is kept instead of written.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from servepilot.core.config import Priority
from servepilot.gateway.access_log import Trail
from servepilot.gateway.auth import Caller
from servepilot.gateway.errors import GatewayError
from servepilot.http1 import HttpRequest

if TYPE_CHECKING:
    from servepilot.http1 import HttpConnection

InferenceRoute = Callable[[HttpRequest, Caller, Trail | None], Awaitable[None]]

BATCH_CALLER = Caller("batch", Priority.P2, ceiling=Priority.P2, tenant="batch")
_HEADERS = {"content-type": "application/json", "x-priority": "2"}


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes


class _NoClient:
    """The connection of a request no client sent: always open, never written to."""

    closed = False
    paused = False


class _LocalRequest(HttpRequest):
    __slots__ = ("answer",)

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        if self.responded:
            raise RuntimeError("this request was already answered")
        self.responded = True
        self.status = status
        self.answer = Answer(status, body)


async def send(route: InferenceRoute, path: str, body: bytes) -> Answer:
    """Run one line through `route` (the proxy's handler of `path`) and return its answer;
    an error the gateway answers (400, 404, 429, 502, 503, 504) is an answer too."""
    conn = cast("HttpConnection", _NoClient())
    request = _LocalRequest(conn, "POST", path.encode(), dict(_HEADERS), body, True, True,
                            time.monotonic())  # fmt: skip
    try:
        await route(request, BATCH_CALLER, None)
    except GatewayError as exc:
        return Answer(exc.status, exc.body())
    if not request.responded:
        raise RuntimeError(f"the {path} route did not answer a batch line")
    answer: Answer = request.answer
    return answer
