"""The gateway's aiohttp application and the `Gateway` that serves it.

A `Gateway(config)` takes its policy from `config.policy`; register replicas with
`await gateway.pool.add(replica_id, url)`, serve with `await gateway.start()` (which also
starts the health checker and returns the bound port) and end with `await gateway.stop()`.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from servepilot.core.config import GatewayConfig
from servepilot.gateway.admin import AdminHandlers
from servepilot.gateway.errors import (
    INTERNAL,
    INVALID_REQUEST,
    GatewayError,
    error_response,
    no_ready_replica,
)
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.gateway.pool import ReplicaPool
from servepilot.gateway.proxy import Proxy
from servepilot.routing import make_policy
from servepilot.routing.base import RoutingPolicy

log = logging.getLogger(__name__)

METRICS_KEY = web.AppKey("metrics", GatewayMetrics)
POOL_KEY = web.AppKey("pool", ReplicaPool)

# Once the drain timeout has passed, how long requests still running get before aiohttp
# cancels their handlers (which closes their upstream connections).
_CANCEL_GRACE_S = 1.0
_HEALTH_BODY = json.dumps({"status": "ok"}).encode()


def build_app(config: GatewayConfig, pool: ReplicaPool, policy: RoutingPolicy) -> web.Application:
    metrics = GatewayMetrics(pool)
    proxy = Proxy(config, pool, policy, metrics)
    info = _InfoHandlers(config, pool, metrics)
    admin = AdminHandlers(pool)
    app = web.Application(
        middlewares=[_error_middleware(metrics)], client_max_size=config.max_body_bytes
    )
    app[METRICS_KEY] = metrics
    app[POOL_KEY] = pool
    router = app.router
    router.add_post("/v1/chat/completions", proxy.chat_completions)
    router.add_post("/v1/completions", proxy.completions)
    router.add_post("/tokenize", proxy.tokenize)
    router.add_post("/detokenize", proxy.detokenize)
    router.add_get("/v1/models", info.models, allow_head=False)
    router.add_get("/health", info.health, allow_head=False)
    router.add_get("/ready", info.ready, allow_head=False)
    router.add_get("/metrics", info.metrics, allow_head=False)
    router.add_get("/admin/replicas", admin.list_replicas, allow_head=False)
    router.add_post("/admin/replicas", admin.add_replica)
    router.add_delete("/admin/replicas/{replica_id}", admin.remove_replica)
    return app


def _error_middleware(metrics: GatewayMetrics) -> Middleware:
    @web.middleware
    async def handle_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except GatewayError as exc:
            response = exc.to_response()
        except web.HTTPException as exc:
            response = _from_http_exception(request, exc)
        except Exception:
            # A bug must still answer in the API's error shape, never with an HTML page.
            log.exception("unexpected error answering %s %s", request.method, request.path)
            response = error_response(
                500,
                "the gateway failed to handle this request",
                error_type=INTERNAL,
                code="internal_error",
            )
        resource = request.match_info.route.resource
        # Unmatched paths share one label so scanners cannot blow up the series count.
        metrics.count_request(resource.canonical if resource else "unmatched", response.status)
        return response

    return handle_errors


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    status = exc.status
    headers: dict[str, str] = {}
    if status == 404:
        message, code = f"no route {request.method} {request.path}", "not_found"
    elif status == 405:
        message, code = f"{request.method} is not allowed on {request.path}", "method_not_allowed"
        if "Allow" in exc.headers:
            headers["Allow"] = exc.headers["Allow"]
    elif status == 413:
        message, code = "the request body is too large", "body_too_large"
    else:
        message, code = exc.reason, f"http_{status}"
    return error_response(status, message, error_type=INVALID_REQUEST, code=code, headers=headers)


class _InfoHandlers:
    def __init__(self, config: GatewayConfig, pool: ReplicaPool, metrics: GatewayMetrics) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(body=_HEALTH_BODY, content_type="application/json")

    async def ready(self, request: web.Request) -> web.Response:
        if not self._pool.ready():
            raise no_ready_replica(self._config.retry_after_s)
        healthy = sum(1 for r in self._pool.replicas() if r.healthy and not r.draining)
        return web.json_response({"status": "ready", "ready_replicas": healthy})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def models(self, request: web.Request) -> web.Response:
        if not self._pool.ready():
            raise no_ready_replica(self._config.retry_after_s)
        return web.json_response({"object": "list", "data": self._pool.model_cards()})


class Gateway:
    """The gateway server: the app, its replica pool and its health checker, on one port."""

    def __init__(
        self,
        config: GatewayConfig,
        policy: RoutingPolicy | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.pool = ReplicaPool(config)
        self.policy = policy if policy is not None else make_policy(config.policy, seed)
        self.app = build_app(config, self.pool, self.policy)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    @property
    def metrics(self) -> GatewayMetrics:
        return self.app[METRICS_KEY]

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Listen (on the config's host/port unless given) and return the bound port."""
        if self._runner is not None:
            raise RuntimeError("the gateway is already started")
        runner = web.AppRunner(
            self.app,
            access_log=None,  # a log line per request costs more CPU than the proxying
            # Cancel a handler when its client disconnects, so the upstream request is
            # closed (and the generation aborted) instead of running to its end.
            handler_cancellation=True,
            shutdown_timeout=_CANCEL_GRACE_S,
        )
        await runner.setup()
        site = web.TCPSite(
            runner, host or self.config.host, self.config.port if port is None else port
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        self.pool.start_health_checks()
        bound_port: int = runner.addresses[0][1]
        log.info("gateway listening on %s:%d", host or self.config.host, bound_port)
        return bound_port

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish (up to the timeout), then stop the
        health checker and close the upstream connections."""
        runner, site = self._runner, self._site
        self._runner = self._site = None
        if runner is not None and site is not None:
            await site.stop()
            if runner.server is not None:
                # Idle keep-alive connections close now and busy ones after their response,
                # so a client cannot slip new requests in while we drain.
                runner.server.pre_shutdown()
            if not await self.pool.wait_idle(drain_timeout_s):
                log.warning(
                    "drain timeout: %d requests still in flight", self.pool.total_in_flight()
                )
            await runner.cleanup()
        await self.pool.close()
