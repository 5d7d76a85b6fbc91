"""The I/O of a continuation: read what was sent, ask the policy, send the rest elsewhere.

The proxy hands over a stream whose replica failed after the first relayed token; this goes
on from another replica (through the dispatcher, so admission and routing still apply) until
the answer ends, the policy gives up, or the client leaves.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from servepilot.core.config.gateway import ContinuationConfig
from servepilot.gateway.continuation.count import tokens_in
from servepilot.gateway.continuation.policy import (
    Candidate,
    Continue,
    Failure,
    Finish,
    GiveUp,
    Situation,
    Stop,
    decide,
)
from servepilot.gateway.continuation.relay import ContinuationRelay
from servepilot.gateway.continuation.splice import Splicer
from servepilot.gateway.continuation.transcript import (
    NotContinuable,
    Transcript,
    continuation_body,
    read_transcript,
    usage_asked,
)
from servepilot.gateway.continuation.watchdog import StreamBroken, Watchdog
from servepilot.gateway.dispatch import Dispatcher
from servepilot.gateway.errors import GatewayError
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.gateway.pool import ReplicaPool
from servepilot.gateway.relay import Outcome, Relay, ReplicaErrorEvent
from servepilot.gateway.replica import Replica
from servepilot.http1 import HttpRequest
from servepilot.http1.client import ClientConnection
from servepilot.http1.errors import UpstreamFailed
from servepilot.routing.base import RequestView

log = logging.getLogger(__name__)

OPT_OUT_HEADER = "x-servepilot-continue"
CHAT_PATH = "/v1/chat/completions"
CONTINUED_PATHS = (CHAT_PATH, "/v1/completions")
_DONE_EVENT = b"data: [DONE]\n\n"
_WAIT_TICK_S = 0.25
"""How often a stream waiting for a replica looks again (the pool's view is in memory)."""


class Relaying(Protocol):
    """Makes the relay of each attempt (on each connection tried)."""

    def relay(
        self, conn: ClientConnection, replica: Replica, loop: asyncio.AbstractEventLoop
    ) -> Relay: ...


Attempt = Callable[[Replica, bytes, Relaying], Awaitable[Outcome]]
"""One try on one replica with the body given, through the relays made for it."""


def failure_kind(outcome: Outcome) -> Failure:
    failure = outcome.failure
    if isinstance(failure, StreamBroken):
        return failure.kind
    if isinstance(failure, ReplicaErrorEvent):
        return Failure.ERROR_EVENT
    return Failure.RESET if failure is not None and failure.__cause__ else Failure.EOF


@dataclass(slots=True)
class Broken:
    """A stream broken after its first token, as the proxy hands it over."""

    request: HttpRequest
    view: RequestView
    tenant: str
    doc: dict[str, Any]
    chat: bool
    relayed: list[bytes]
    replica_id: str
    outcome: Outcome
    whole: bool = False
    """A non-streamed answer: the parts are kept in `relayed`, none is sent to the client."""
    used: list[str] = field(default_factory=list)


class Continuer:
    """Continues broken streams (one per gateway)."""

    def __init__(
        self,
        config: ContinuationConfig,
        pool: ReplicaPool,
        dispatcher: Dispatcher,
        metrics: GatewayMetrics,
    ) -> None:
        self._config = config
        self._enabled = config.enabled
        self.whole_answers = config.whole_answers
        self._pool = pool
        self._dispatcher = dispatcher
        self._metrics = metrics
        self.watchdog = Watchdog(config.stall_timeout_s, self._stalled)

    def _stalled(self, replica_id: str, why: str) -> None:
        self._pool.mark_down(replica_id, f"a stream stalled ({why})")

    def covers(self, request: HttpRequest, path: str) -> bool:
        """Whether answers on `path` may be continued (the request did not opt out)."""
        if not self._enabled or path not in CONTINUED_PATHS:
            return False
        opt_out = request.headers.get(OPT_OUT_HEADER)
        return opt_out is None or opt_out.strip() not in ("0", "false", "off")

    async def carry_on(self, broken: Broken, attempt: Attempt) -> Outcome:
        """Continue until the answer ends; the last outcome (a failure: the proxy ends the
        stream with its error event). `broken.used` lists the replicas it went through."""
        request, outcome = broken.request, broken.outcome
        sent = read_transcript(b"".join(broken.relayed), chat=broken.chat)
        broken.used.append(broken.replica_id)
        continuations = 0
        waiting = _Wait(self._config.replica_wait_s)
        while outcome.failure is not None and outcome.streamed and request.connected:
            kind = failure_kind(outcome)
            decision = decide(self._situation(broken, sent, kind, continuations),
                              self._config, self._candidates(broken.view.model))  # fmt: skip
            if isinstance(decision, Finish):
                if not broken.whole:
                    request.end_stream(_DONE_EVENT)
                return replace(outcome, failure=None)
            no_replica = isinstance(decision, Stop) and decision.reason is GiveUp.NO_REPLICA
            if no_replica and await waiting.tick():  # one may come back (a restart, a check)
                continue
            if not isinstance(decision, Continue):
                why = f"{outcome.failure}; not continued: {decision.message}"
                return replace(outcome, failure=UpstreamFailed(why))
            try:
                outcome, splicer = await self._send_rest(broken, decision, sent, attempt)
            except _NoneConnected as exc:
                if await waiting.tick():  # a replica still in rotation had gone: try again
                    continue
                return replace(outcome, failure=UpstreamFailed(f"{outcome.failure}; {exc}"))
            except _CannotStart as exc:
                return replace(outcome, failure=UpstreamFailed(f"{outcome.failure}; {exc}"))
            self._metrics.count_continuation(str(kind))
            continuations += 1
            waiting = _Wait(self._config.replica_wait_s)
            sent = splicer.transcript()
        return outcome

    async def _send_rest(
        self, broken: Broken, decision: Continue, sent: Transcript, attempt: Attempt
    ) -> tuple[Outcome, Splicer]:
        allowed = set(decision.replica_ids)
        known = (info.replica_id for info in self._pool.replicas())
        exclude = {rid for rid in known if rid not in allowed}
        try:
            grant = await self._dispatcher.acquire(broken.view, exclude, broken.tenant)
        except GatewayError as exc:
            raise _NoneConnected(f"no replica took the continuation: {exc.message}") from None
        replica = grant.replica
        broken.used.append(replica.replica_id)
        try:
            if sent.text:
                counted = await tokens_in(replica, broken.view.model, sent.text)
                if counted is not None and counted > sent.tokens:  # events held merged tokens
                    sent = replace(sent, tokens=counted)
            splicer = Splicer(sent, broken.whole or usage_asked(broken.doc))
            body = json.dumps(continuation_body(broken.doc, sent, chat=broken.chat))
            log.info("continuing a stream on replica %s after %d tokens (replicas so far: %s)",
                     replica.replica_id, sent.tokens, ",".join(broken.used))  # fmt: skip
            kept = broken.relayed if broken.whole else None
            outcome = await attempt(replica, body.encode(), _Rest(broken.request, splicer, kept))
        except BaseException:
            self._dispatcher.release(grant, None)
            raise
        self._dispatcher.release(grant, outcome)
        if outcome.failure is None and not outcome.streamed:
            # The replica refused the continuation (a 4xx/5xx): say so in the stream.
            excerpt = outcome.body[:300].decode("utf-8", "replace")
            raise _CannotStart(f"replica {replica.replica_id} refused the continuation: "
                               f"HTTP {outcome.status}: {excerpt}")  # fmt: skip
        if outcome.failure is not None and not outcome.streamed:
            raise _CannotStart(f"replica {replica.replica_id} failed: {outcome.failure}")
        return outcome, splicer

    def _situation(
        self, broken: Broken, sent: Transcript, kind: Failure, continuations: int
    ) -> Situation:
        try:
            continuation_body(broken.doc, sent, chat=broken.chat)
            continuable = True
        except NotContinuable:
            continuable = False
        return Situation(
            failure=kind,
            continuations=continuations,
            opted_out=False,
            sent=sent,
            continuable=continuable,
            context_tokens=broken.view.prompt_tokens + sent.tokens,
            used=frozenset(broken.used),
            failed_on=broken.used[-1],
        )

    def _candidates(self, model: str) -> list[Candidate]:
        pool = self._pool
        return [
            Candidate(info.replica_id, info.serving, _model_len(pool.live(info.replica_id), model))
            for info in pool.replicas()
            if not model or not info.models or model in info.models
        ]


def _model_len(replica: Replica, model: str) -> int | None:
    for card in replica.model_cards:
        if isinstance(card, dict) and card.get("id") == model:
            value = card.get("max_model_len")
            return value if isinstance(value, int) else None
    return None


@dataclass(frozen=True, slots=True)
class _Rest:
    request: HttpRequest
    splicer: Splicer
    kept: list[bytes] | None

    def relay(
        self, conn: ClientConnection, replica: Replica, loop: asyncio.AbstractEventLoop
    ) -> Relay:
        return ContinuationRelay(self.request, conn, replica.header, loop, self.splicer,
                                 self.kept)  # fmt: skip


class _CannotStart(Exception):
    """The continuation failed before any of its events reached the client: the stream is
    still open, and the proxy ends it with an error event."""


class _NoneConnected(_CannotStart):
    """No replica allowed could be reached (the dispatcher tried them)."""


class _Wait:
    """How long a stream waits, a tick at a time, for a replica to continue on."""

    def __init__(self, limit_s: float) -> None:
        self._limit_s = limit_s
        self._until_s: float | None = None

    async def tick(self) -> bool:
        """Sleep a tick (the last one: what is left) and say True while the wait lasts;
        False once it is over. The stream waits the whole limit, however late its ticks wake
        on a busy loop (giving up when a whole tick no longer fit ended a 0.6 s wait after
        0.35 s)."""
        now_s = asyncio.get_running_loop().time()
        if self._until_s is None:
            self._until_s = now_s + self._limit_s
        left_s = self._until_s - now_s
        if left_s <= 0:
            return False
        await asyncio.sleep(min(_WAIT_TICK_S, left_s))
        return True
