"""The gateway: its routes, and the `Gateway` object that serves them.

A `Gateway(config)` takes its policy from `config.policy`; register replicas with
`await gateway.pool.add(replica_id, url)`, serve with `await gateway.start()` (which also
starts the health checker and the dispatcher's clock, and returns the bound port) and end
with `await gateway.stop()`, which drains in-flight requests first.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from servepilot.core.config import GatewayConfig, PolicyName
from servepilot.gateway.access_log import (
    CLIENT_CLOSED_STATUS,
    CLIENT_DISCONNECTED,
    AccessLog,
    Trail,
)
from servepilot.gateway.admin import AdminHandlers
from servepilot.gateway.auth import Authenticator, Caller
from servepilot.gateway.batch import BatchApi
from servepilot.gateway.batch.exchange import BATCH_CALLER, Answer, send
from servepilot.gateway.batch.metrics import BatchCollector
from servepilot.gateway.batch.scheduler import FleetRoom
from servepilot.gateway.dispatch import Dispatcher
from servepilot.gateway.errors import (
    INVALID_REQUEST,
    GatewayError,
    no_ready_replica,
    server_error_body,
)
from servepilot.gateway.kv_events import KvEventFeeds, KvIndexCollector
from servepilot.gateway.membership import Membership
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.gateway.pool import ReplicaPool
from servepilot.gateway.proxy import Proxy
from servepilot.gateway.routes import PROXIED
from servepilot.gateway.tokens import PromptBlocks, PromptTokenizer
from servepilot.gateway.warm import WarmPool
from servepilot.http1 import HttpRequest, HttpServer, Limits, Rejected, UploadLimit
from servepilot.routing import StepTimeModel, make_policy
from servepilot.routing.base import RoutingPolicy
from servepilot.routing.kv_index import BlockHashing, KvIndex

log = logging.getLogger(__name__)

_HEALTH_BODY = json.dumps({"status": "ok"}).encode()
_ADMIN_PREFIX = "/admin/replicas/"
_PREFIX_POLICIES = (PolicyName.PREFIX_AFFINITY, PolicyName.HYBRID, PolicyName.PREDICTED_LATENCY)

Route = Callable[[HttpRequest], Awaitable[None]]
InferenceRoute = Callable[[HttpRequest, Caller, Trail | None], Awaitable[None]]


class Gateway:
    """The gateway server: routes, replica pool, dispatcher and health checker, on one port."""

    def __init__(
        self,
        config: GatewayConfig,
        policy: RoutingPolicy | None = None,
        *,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        access_log_path: Path | None = None,
        step_model: Callable[[str], StepTimeModel] | None = None,
    ) -> None:
        """`access_log_path` (else `config.access_log.path`) is where the access log goes,
        when it is enabled; with neither, there is none. `step_model(replica_id)`: each
        replica's step times, which the predicted_latency policy needs."""
        self.config = config
        self.auth = Authenticator(config.auth)
        self.pool = ReplicaPool(config)
        self.kv_feeds, tokens = _kv_index(config)
        self._prompt_blocks = tokens
        """Where replicas publish KV events, the exact index they keep; None without one."""
        kv_index = self.kv_feeds.index if self.kv_feeds is not None else None
        self.policy = (
            policy
            if policy is not None
            else make_policy(
                config.policy,
                config.routing,
                seed,
                clock=clock,
                step_model=step_model,
                kv_index=kv_index,
            )
        )
        self.pool.on_remove(self.policy.forget)
        if self.kv_feeds is not None:
            self.pool.on_remove(self.kv_feeds.unsubscribe)
        self.metrics = GatewayMetrics(self.pool, self.policy)
        self.metrics.know_tenants(
            [*self.auth.tenants(), *config.admission.tenant_weights, BATCH_CALLER.tenant]
        )
        self.dispatcher = Dispatcher(config, self.pool, self.policy, self.metrics, clock, seed)
        self.metrics.watch(self.dispatcher)
        self.access_log = _access_log(config, access_log_path)
        self.metrics.watch_access_log(self.access_log)
        if self.kv_feeds is not None:
            self.metrics.registry.register(KvIndexCollector(self.kv_feeds))
        proxy = Proxy(config, self.pool, self.policy, self.dispatcher, self.metrics, tokens)
        self.warm = WarmPool(self.pool)
        self.membership = Membership(self.pool, self.kv_feeds)
        """Where replicas join and leave, whoever runs them."""
        admin = AdminHandlers(self.pool, self.warm, self.kv_feeds)
        self._inference: dict[str, InferenceRoute] = {
            route.path: functools.partial(proxy.forward, route) for route in PROXIED
        }
        self._inference["/tokenize"] = proxy.tokenize
        self._inference["/detokenize"] = proxy.detokenize
        self._gets: dict[str, Route] = {
            "/v1/models": self._models,
            "/health": self._health,
            "/ready": self._ready,
            "/metrics": self._metrics,
        }
        self._admin_list = admin.list_replicas
        self._admin_add = admin.add_replica
        self._admin_replica = admin.replica_route
        self._clock = clock
        self.batch: BatchApi | None = None
        uploads: tuple[UploadLimit, ...] = ()
        if config.batch.enabled:
            self.batch = BatchApi(config.batch, self._send_batch_line, self._batch_room)
            uploads = (self.batch.upload_limit,)
            self.metrics.registry.register(BatchCollector(self.batch.scheduler))
        self._server = HttpServer(
            self.handle,
            Limits(config.max_body_bytes, uploads=uploads),
            server_error_body,
            self._rejected,
        )
        self._started = False

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Listen (on the config's host/port unless given) and return the bound port."""
        if self._started:
            raise RuntimeError("the gateway is already started")
        if self.access_log is not None:
            self.access_log.start()  # first: a log that cannot be written stops nothing
        try:
            bound = await self._server.start(
                host or self.config.host, self.config.port if port is None else port
            )
        except BaseException:
            if self.access_log is not None:
                await self.access_log.close()
            raise
        self._started = True
        self.pool.start_health_checks()
        self.dispatcher.start()
        if self.batch is not None:
            await self.batch.start()
        log.info("gateway listening on %s:%d", host or self.config.host, bound)
        return bound

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish (up to the timeout), then stop the
        dispatcher and the health checker and close every connection."""
        if self._started:
            self._started = False
            self._server.stop_listening()
            if self.batch is not None:  # lines still in flight after it: sent again next start
                await self.batch.stop_jobs(drain_timeout_s)
            await self.dispatcher.drain(drain_timeout_s)
            if not await self.pool.wait_idle(drain_timeout_s):
                log.warning(
                    "drain timeout: %d requests still in flight", self.pool.total_in_flight()
                )
            await self._server.close()
            if self.batch is not None:
                await self.batch.close()
            if self.access_log is not None:
                await self.access_log.close()  # every request has ended: its line is in
        await self.dispatcher.stop()
        if self.kv_feeds is not None:
            await self.kv_feeds.close()
        if self._prompt_blocks is not None:
            self._prompt_blocks.close()
        await self.pool.close()

    # --- routing of HTTP requests -----------------------------------------------------------

    async def handle(self, request: HttpRequest) -> None:
        """Answer one request; errors become OpenAI-shaped JSON, never a traceback."""
        trail = None if self.access_log is None else Trail()
        error: str | None = None
        try:
            await self._route(request, trail)
        except GatewayError as exc:
            if request.responded:
                raise RuntimeError(f"{exc.status} after the response started: {exc}") from exc
            body = exc.body()
            request.respond(exc.status, body, headers=exc.header_pairs())
            error = exc.code
            if trail is not None:
                trail.bytes_out = len(body)
        except asyncio.CancelledError:
            # The client left (or the gateway stops): no status counted, but a line logged.
            # A client that left mid-answer did not get it: 499 whatever status had begun it.
            if trail is not None:
                if not request.connected:
                    self._log(request, trail, CLIENT_CLOSED_STATUS, CLIENT_DISCONNECTED)
                else:
                    status = request.status or CLIENT_CLOSED_STATUS
                    self._log(request, trail, status, "gateway_stopped")
            raise
        except Exception:
            # A bug must still answer in the API's error shape (the server does that), and
            # be counted.
            self.metrics.count_request(self._route_label(request.path), 500)
            if trail is not None:
                self._log(request, trail, 500, "internal_error")
            raise
        self.metrics.count_request(self._route_label(request.path), request.status)
        if trail is not None:
            self._log(request, trail, request.status, error or trail.error)

    def _route_label(self, path: str) -> str:
        """The `route` label of a path: one per route, so scanners cannot blow up the series."""
        if path in self._inference or path in self._gets or path == "/admin/replicas":
            return path
        if self.batch is not None and self.batch.owns(path):
            return self.batch.route_label(path)
        return "/admin/replicas/{id}" if path.startswith(_ADMIN_PREFIX) else "unmatched"

    def _route(self, request: HttpRequest, trail: Trail | None) -> Awaitable[None]:
        """The handler's coroutine for the request's route (a plain call: one coroutine
        less per request), or its error."""
        path = request.path
        inference = self._inference.get(path)
        if inference is not None:
            self._allow(request, "POST")
            caller = self.auth.caller(request.headers.get("authorization"), self._clock())
            return inference(request, caller, trail)
        if path in self._gets:
            self._allow(request, "GET")
            return self._gets[path](request)
        if path == "/admin/replicas" or path.startswith(_ADMIN_PREFIX):
            return self._admin(request)
        if self.batch is not None and self.batch.owns(path):
            self.auth.caller(request.headers.get("authorization"), self._clock())
            return self.batch.handle(request)
        raise GatewayError(
            404,
            f"no route {request.method} {path}",
            error_type=INVALID_REQUEST,
            code="not_found",
        )

    def _log(self, request: HttpRequest, trail: Trail, status: int, error: str | None) -> None:
        """The request's access log line; every error gets one, answers as sampled."""
        access = self.access_log
        assert access is not None
        if error is None and status < 400 and not access.sampled():
            return
        e2e_s = time.monotonic() - request.received_at
        access.record(request.method, request.path, status, e2e_s, len(request.body), trail, error)

    async def _admin(self, request: HttpRequest) -> None:
        self.auth.check_admin(request.headers.get("authorization"))
        if request.path == "/admin/replicas":
            if request.method == "GET":
                await self._admin_list(request)
            else:
                self._allow(request, "GET, POST", "POST")
                await self._admin_add(request)
            return
        await self._admin_replica(request, request.path[len(_ADMIN_PREFIX) :])

    @staticmethod
    def _allow(request: HttpRequest, allowed: str, method: str | None = None) -> None:
        if request.method != (method or allowed):
            raise GatewayError(
                405,
                f"{request.method} is not allowed on {request.path}",
                error_type=INVALID_REQUEST,
                code="method_not_allowed",
                headers={"Allow": allowed},
            )

    # --- batch lines: the proxy's routes, in process, at priority 2 -------------------------

    async def _send_batch_line(self, path: str, body: bytes) -> Answer:
        return await send(self._inference[path], path, body)

    def _batch_room(self) -> FleetRoom:
        p0, p1, p2 = self.dispatcher.queue.depth_by_class()
        views = self.pool.snapshot()
        free = sum(max(0, view.capacity - view.in_flight) for view in views)
        return FleetRoom(p0 + p1, p2, free, sum(view.capacity for view in views))

    def _rejected(self, rejected: Rejected) -> None:
        """A request the HTTP server refused before routing (400, 413, 431): counted, and
        logged like any other error."""
        self.metrics.count_request("unparsed", rejected.status)
        access = self.access_log
        if access is not None:
            trail = Trail()
            trail.bytes_out = rejected.answer_bytes
            method, path = rejected.method, rejected.path
            access.record(method, path, rejected.status, None, rejected.body_bytes, trail,
                          rejected.code)  # fmt: skip

    # --- informational routes ---------------------------------------------------------------

    async def _health(self, request: HttpRequest) -> None:
        request.respond(200, _HEALTH_BODY)

    async def _ready(self, request: HttpRequest) -> None:
        if not self.pool.ready():
            raise no_ready_replica(self.config.retry_after_s)
        healthy = sum(1 for r in self.pool.replicas() if r.serving)
        request.respond(200, json.dumps({"status": "ready", "ready_replicas": healthy}).encode())

    async def _metrics(self, request: HttpRequest) -> None:
        request.respond(200, self.metrics.render(), CONTENT_TYPE_LATEST.encode())

    async def _models(self, request: HttpRequest) -> None:
        if not self.pool.ready():
            raise no_ready_replica(self.config.retry_after_s)
        body = {"object": "list", "data": self.pool.model_cards()}
        request.respond(200, json.dumps(body).encode())


def _kv_index(config: GatewayConfig) -> tuple[KvEventFeeds | None, PromptBlocks | None]:
    """The exact prefix index and the tokenizer it needs, when the config names the model's
    tokenizer and the policy looks at prefixes; else neither (prefixes are guessed)."""
    settings = config.kv_index
    if settings.tokenizer is None or config.policy not in _PREFIX_POLICIES:
        return None, None
    try:
        tokenizer = PromptTokenizer(settings.tokenizer, settings.token_cache_chars)
    except (OSError, ValueError, ImportError) as exc:
        log.warning("no exact prefix index: cannot load the tokenizer %s (%s)",
                    settings.tokenizer, exc)  # fmt: skip
        return None, None
    hashing = BlockHashing(settings.block_size, settings.hash_seed)
    return KvEventFeeds(KvIndex(hashing)), PromptBlocks(tokenizer, hashing)


def _access_log(config: GatewayConfig, path: Path | None) -> AccessLog | None:
    settings = config.access_log
    where = path or (Path(settings.path) if settings.path else None)
    if not settings.enabled or where is None:
        return None
    return AccessLog(settings, where)
