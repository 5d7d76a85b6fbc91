"""The inference routes: validate, admit, route, forward the body bytes, relay the answer.

Kept lean on purpose (it is benchmarked for CPU time per request against vllm-router): the
body is parsed once, forwarded as the original bytes, and the answer is relayed from the
upstream connection's callbacks (see `relay`). A request whose replica fails before the first
byte of the answer is retried on another replica; one that fails after its first token is
continued on another (gateway/continuation: the guard of the request makes its relays); a
client that disconnects cancels the handler, which drops the upstream connection and so
aborts the generation. How the last attempt becomes the client's answer: `answer`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from functools import partial

from servepilot.core.config import GatewayConfig
from servepilot.gateway.access_log import Trail
from servepilot.gateway.answer import deliver
from servepilot.gateway.auth import Caller
from servepilot.gateway.continuation.edge import Continuer, Relaying
from servepilot.gateway.continuation.guard import guard_for
from servepilot.gateway.deadlines import Deadlines
from servepilot.gateway.dispatch import Dispatcher
from servepilot.gateway.errors import (
    INVALID_REQUEST,
    GatewayError,
    bad_request,
)
from servepilot.gateway.metrics import GatewayMetrics, RouteLatency
from servepilot.gateway.pool import ReplicaPool
from servepilot.gateway.relay import Outcome, Relay
from servepilot.gateway.replica import Replica
from servepilot.gateway.routes import (
    DETOKENIZE,
    PROXIED,
    TOKENIZE,
    TOKENIZE_CHAT,
    ApiRoute,
)
from servepilot.gateway.tokens import PromptBlocks, PromptKeys
from servepilot.gateway.validation import (
    InferenceRequest,
    parse_inference_request,
    parse_multipart_request,
)
from servepilot.http1 import HttpRequest
from servepilot.http1.errors import UpstreamFailed
from servepilot.routing.base import RequestView, RoutingPolicy
from servepilot.routing.prefix import prefix_hashes, prompt_text

log = logging.getLogger(__name__)

# Request headers the engine may act on; everything else (Host, hop-by-hop, cookies) stays.
_FORWARDED_HEADERS = ("accept", "x-request-id", "traceparent")


class Proxy:
    """Handlers for the OpenAI inference routes (routes.py)."""

    def __init__(
        self,
        config: GatewayConfig,
        pool: ReplicaPool,
        policy: RoutingPolicy,
        dispatcher: Dispatcher,
        metrics: GatewayMetrics,
        prompt_blocks: PromptBlocks | None = None,
    ) -> None:
        self._config = config
        self._prompt_blocks = prompt_blocks
        self._pool = pool
        self._policy = policy
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._continuer = Continuer(config.continuation, pool, dispatcher, metrics)
        self._loop: asyncio.AbstractEventLoop | None = None
        # One timer for every request's timeout, not one per request.
        self._deadlines = Deadlines(config.request_timeout_s)
        # The gateway's own key is not the replicas' business; without auth it passes on.
        self._forwarded = _FORWARDED_HEADERS + (() if config.auth.keys else ("authorization",))
        # Inference latency only: a tokenizer call's milliseconds would pass for the fleet's.
        self._latency: dict[str, RouteLatency] = {
            route.path: metrics.route_latency(route.path) for route in PROXIED if route.admitted
        }

    async def forward(
        self, route: ApiRoute, request: HttpRequest, caller: Caller, trail: Trail | None
    ) -> None:
        """Proxy one request on `route` (bound per route with functools.partial)."""
        try:
            await self._forward(request, caller, trail, route)
        except asyncio.CancelledError:
            if not request.connected:
                self._metrics.count_error("client_disconnected")
            raise

    # vLLM's tokenizer endpoints, so a load tester pointed at the gateway can build prompts
    # of exact token counts with the replicas' own tokenizer.
    async def tokenize(self, request: HttpRequest, caller: Caller, trail: Trail | None) -> None:
        # vLLM takes a `prompt` or chat `messages` (counted with the chat template, which
        # bench sizes chat prompts by). A second parse, but tokenizer calls are not hot.
        route = TOKENIZE_CHAT if _tokenize_field(request.body) == "messages" else TOKENIZE
        await self.forward(route, request, caller, trail)

    async def detokenize(self, request: HttpRequest, caller: Caller, trail: Trail | None) -> None:
        await self.forward(DETOKENIZE, request, caller, trail)

    async def _forward(
        self, request: HttpRequest, caller: Caller, trail: Trail | None, route: ApiRoute
    ) -> None:
        content_type: bytes | None = None
        if route.multipart:  # forwarded as it came, boundary and all
            given = request.headers.get("content-type", "application/octet-stream")
            content_type = given.encode("latin-1")
            parsed = parse_multipart_request(request.body, content_type)
        else:
            parsed = parse_inference_request(request.body, route.prompt_field)
        model = self._model(parsed.model)
        started = time.perf_counter()
        admitted = route.admitted
        self._metrics.arrivals += admitted
        keys = None
        if admitted and self._prompt_blocks is not None and self._policy.uses_prefix:
            keys = await self._prompt_blocks.keys_async(parsed.doc)
        view = self._view(request, caller, parsed, model, admitted, keys)
        if trail is not None:
            trail.model, trail.stream = model or None, parsed.stream
            trail.prompt_chars, trail.priority = parsed.prompt_chars, view.priority
        extra = self._extra_headers(request)
        body = request.body
        tried: set[str] = set()
        guard = guard_for(self._continuer, request, route.path, parsed.doc, parsed.stream)
        while True:
            if admitted:
                grant = await self._dispatcher.acquire(view, tried, caller.tenant)
            else:
                grant = self._dispatcher.acquire_tokenizer(view, tried)
            if grant.max_tokens_cap is not None and route.cap_fields:
                body = _capped(parsed, grant.max_tokens_cap, body, route.cap_fields)
            replica = grant.replica
            try:
                sent = body if guard is None else guard.body(body)
                outcome = await self._attempt(request, route.path, extra, content_type, trail,
                                              started, replica, sent, guard)  # fmt: skip
            except BaseException:  # the client left (cancelled): the slot is abandoned
                self._dispatcher.release(grant, None)
                raise
            self._dispatcher.release(grant, outcome)
            if outcome.failure is not None and outcome.retryable:
                tried.add(replica.replica_id)
                self._metrics.count_retry()
                continue
            if guard is not None and (guard.whole or outcome.failure is not None):
                attempt = partial(self._attempt, request, route.path, extra, None, trail, started)
                outcome = await guard.settle(outcome, view, caller.tenant, replica.replica_id,
                                             attempt, trail)  # fmt: skip
            first = outcome.first_chunk_at
            ttft_s = None if first is None else first - started
            latency = self._latency.get(route.path)
            if latency is not None:
                latency.observe(view.priority, ttft_s, time.perf_counter() - started)
            if trail is not None:
                _follow(trail, replica.replica_id, outcome, started)
            deliver(request, replica, outcome, route, model, self._metrics)
            return

    def _model(self, asked: str | None) -> str:
        """The model a request goes to: the one it names, which some replica must serve, or
        without one (as vLLM allows) the fleet's only model; "" while no replica has said
        what it serves (any replica may take it)."""
        known = self._pool.known_models
        if asked is None:
            sole = self._pool.sole_model
            if sole is None and known:
                raise bad_request(
                    "the request body has no `model` and this gateway serves several; "
                    f"name one of: {', '.join(sorted(known))}",
                    "missing_field",
                )
            return sole or ""
        if known and asked not in known:
            raise GatewayError(
                404,
                f"the model {asked!r} does not exist here; served: {', '.join(sorted(known))}",
                error_type=INVALID_REQUEST,
                code="model_not_found",
            )
        return asked

    def _view(
        self,
        request: HttpRequest,
        caller: Caller,
        parsed: InferenceRequest,
        model: str,
        admitted: bool,
        keys: PromptKeys | None,
    ) -> RequestView:
        """What routing and admission know of the request. Calls outside admission (the
        tokenizer's) leave nothing in a replica's prefix cache, so they carry no prefix
        hashes."""
        priority = _priority(request.headers.get("x-priority"), caller)
        routing = self._config.routing
        hashes: tuple[int, ...] = ()
        if admitted and self._policy.uses_prefix:
            block, blocks = routing.prefix_block_chars, routing.prefix_max_blocks
            hashes = prefix_hashes(prompt_text(parsed.doc, block * blocks), block, blocks)
        return RequestView(
            model=model,
            prompt_chars=parsed.prompt_chars,
            prompt_tokens=(
                int(parsed.prompt_chars / routing.chars_per_token) if keys is None else keys.tokens
            ),
            prefix_hashes=hashes,
            kv_block_hashes=() if keys is None else keys.block_hashes,
            session_id=request.headers.get("x-session-id"),
            priority=priority,
            arrival_s=self._dispatcher.now_s(),
        )

    def _extra_headers(self, request: HttpRequest) -> bytes:
        headers = request.headers
        extra = b""
        for name in self._forwarded:  # a loop, not a comprehension: no call of its own
            if name in headers:
                extra += f"{name}: {headers[name]}\r\n".encode("latin-1")
        return extra

    async def _attempt(
        self,
        request: HttpRequest,
        path: str,
        extra: bytes,
        content_type: bytes | None,
        trail: Trail | None,
        started: float,
        replica: Replica,
        body: bytes,
        guard: Relaying | None,
    ) -> Outcome:
        """One try on one replica; a stale keep-alive connection is replaced once. A client
        that leaves meanwhile still gets, in its line, what it was sent of the answer."""
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        for _ in range(2):
            conn = replica.upstream.reuse()
            reused = conn is not None
            if conn is None:
                try:
                    conn = await replica.upstream.connect()
                except UpstreamFailed as exc:
                    self._metrics.count_error("upstream_connect")
                    log.warning("replica %s unreachable: %s", replica.replica_id, exc)
                    return Outcome(status=0, streamed=False, failure=exc, retryable=True)
            if guard is None:
                relay = Relay(request, conn, replica.header, loop)
            else:  # a stream that may be continued: a stall or a sick replica ends it
                relay = guard.relay(conn, replica, loop)
            conn.send(replica.request_head(path, len(body), extra, content_type) + body, relay)
            self._deadlines.add(relay, loop)
            if guard is not None:
                self._continuer.watchdog.add(relay, replica, loop)
            try:
                outcome = await relay.done
            except asyncio.CancelledError:
                if trail is not None:
                    _follow(trail, replica.replica_id, relay.outcome_so_far(), started)
                raise
            finally:
                self._deadlines.discard(relay)
                if guard is not None:
                    self._continuer.watchdog.discard(relay)
                conn.finish()
            if outcome.timed_out:
                self._metrics.count_error("upstream_timeout")
            # A reused connection that broke before answering was most likely closed by the
            # replica while idle: not the replica's fault, try a fresh connection.
            if not (reused and outcome.failure is not None and outcome.retryable):
                return outcome
        return outcome


def _follow(trail: Trail, replica_id: str, outcome: Outcome, started: float) -> None:
    """Note how the request's last attempt went (or how far it got, when the client left
    during it), for its access log line."""
    first = outcome.first_chunk_at
    trail.replica = replica_id
    trail.ttfb_s = outcome.ttfb_s if outcome.status else None
    trail.ttft_s = None if first is None else first - started
    trail.bytes_out = outcome.streamed_bytes if outcome.streamed else len(outcome.body)
    trail.tail = outcome.tail
    if outcome.streamed and outcome.failure is not None:  # the stream ends with an error event
        trail.error = "upstream_interrupted"


def _priority(header: str | None, caller: Caller) -> int:
    """The request's class: the X-Priority header's, never more urgent than the caller may
    ask for (an API key's class; anyone without auth), else the caller's default."""
    if header is None:
        return int(caller.priority)
    value = header.strip()
    if value not in ("0", "1", "2"):
        raise bad_request("X-Priority must be 0 (interactive), 1 (default) or 2 (batch)")
    return max(int(value), int(caller.ceiling))


def _capped(parsed: InferenceRequest, cap: int, body: bytes, fields: tuple[str, ...]) -> bytes:
    """The body with its output-length `fields` lowered to `cap`."""
    doc = dict(parsed.doc)
    changed = False
    for name in fields:
        value = doc.get(name)
        # An absent max_tokens means "up to the context length": that is capped too.
        if (value is None and name == fields[0]) or (isinstance(value, int) and value > cap):
            doc[name] = cap
            changed = True
    return json.dumps(doc).encode() if changed else body


def _tokenize_field(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return "prompt"  # validation answers the 400
    return "messages" if isinstance(doc, dict) and "messages" in doc else "prompt"
