"""The data path: validate, choose a replica, forward the body bytes, relay the answer.

Kept lean on purpose (it is benchmarked for CPU time per request against vllm-router): the
body is parsed once to read `model`/`stream` and forwarded as the original bytes, the upstream
answer is relayed chunk by chunk as it arrives, and all connections are keep-alive
connections of the pool's one client session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from servepilot.core.config import GatewayConfig
from servepilot.gateway.errors import (
    INVALID_REQUEST,
    UPSTREAM,
    GatewayError,
    no_ready_replica,
    sse_error_event,
)
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.gateway.pool import Replica, ReplicaPool
from servepilot.gateway.validation import parse_inference_request, read_body
from servepilot.routing.base import RequestView, RoutingPolicy

log = logging.getLogger(__name__)

REPLICA_HEADER = "X-Servepilot-Replica"
# Request headers the engine may act on; everything else (Host, hop-by-hop, cookies) stays.
_FORWARDED_HEADERS = ("Authorization", "Accept", "X-Request-Id", "traceparent")
# Failures that happen before the replica could have answered anything: safe to send the
# request to another replica instead.
_CONNECT_ERRORS = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
)
_EXCERPT_CHARS = 300


class _ConnectFailed(Exception):
    """The chosen replica could not be reached; another one may be tried."""


class Proxy:
    """Handlers for the OpenAI inference routes."""

    def __init__(
        self,
        config: GatewayConfig,
        pool: ReplicaPool,
        policy: RoutingPolicy,
        metrics: GatewayMetrics,
    ) -> None:
        self._config = config
        self._pool = pool
        self._policy = policy
        self._metrics = metrics
        self._timeout = aiohttp.ClientTimeout(
            total=config.request_timeout_s, connect=config.connect_timeout_s
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/chat/completions", "messages")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/completions", "prompt")

    # vLLM's tokenizer endpoints, so a load tester pointed at the gateway can build prompts
    # of exact token counts with the replicas' own tokenizer.
    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/tokenize", "prompt")

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/detokenize", "tokens")

    async def _proxy(
        self, request: web.Request, path: str, prompt_field: str
    ) -> web.StreamResponse:
        body = await read_body(request, self._config.max_body_bytes)
        parsed = parse_inference_request(body, prompt_field)
        known = self._pool.known_models
        if known and parsed.model not in known:
            raise GatewayError(
                404,
                f"the model {parsed.model!r} does not exist here; "
                f"served: {', '.join(sorted(known))}",
                error_type=INVALID_REQUEST,
                code="model_not_found",
            )
        view = RequestView(
            model=parsed.model,
            prompt_chars=parsed.prompt_chars,
            session_id=request.headers.get("X-Session-Id"),
        )
        headers = _forward_headers(request.headers)
        tried: set[str] = set()
        while True:
            candidates = self._pool.snapshot(parsed.model)
            if tried:
                candidates = [c for c in candidates if c.replica_id not in tried]
            if not candidates:
                if tried:
                    raise GatewayError(
                        502,
                        f"could not connect to any replica (tried {', '.join(sorted(tried))})",
                        error_type=UPSTREAM,
                        code="upstream_unreachable",
                    )
                raise no_ready_replica(self._config.retry_after_s)
            replica_id = self._policy.choose(view, candidates)
            try:
                return await self._forward(request, replica_id, path, body, headers)
            except _ConnectFailed:
                tried.add(replica_id)

    async def _forward(
        self,
        request: web.Request,
        replica_id: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
    ) -> web.StreamResponse:
        pool = self._pool
        replica = pool.acquire(replica_id)
        try:
            loop = asyncio.get_running_loop()
            sent_at = loop.time()
            upstream = await self._send(replica, path, body, headers)
            try:
                self._metrics.upstream_ttfb.observe(loop.time() - sent_at)
                if replica.consecutive_failures:
                    pool.record_success(replica)
                if upstream.status == 200 and upstream.content_type == "text/event-stream":
                    return await self._relay_stream(request, replica_id, upstream)
                return await self._relay_body(replica_id, upstream)
            except asyncio.CancelledError:
                # aiohttp cancels the handler when the client disconnects (and when the
                # gateway stops past its drain timeout).
                self._metrics.count_error("client_disconnected")
                raise
            finally:
                # Closes the connection only if the answer was not read to its end (client
                # gone, upstream error): that aborts the generation on the replica. A fully
                # read answer has already returned its connection to the keep-alive pool.
                upstream.close()
        finally:
            pool.release(replica)

    async def _send(
        self, replica: Replica, path: str, body: bytes, headers: Mapping[str, str]
    ) -> aiohttp.ClientResponse:
        try:
            return await self._pool.session.post(
                replica.endpoint(path), data=body, headers=headers, timeout=self._timeout
            )
        except _CONNECT_ERRORS as exc:
            self._pool.record_failure(replica)
            self._metrics.count_error("upstream_connect")
            log.warning("replica %s unreachable: %s", replica.replica_id, exc)
            raise _ConnectFailed from exc
        except TimeoutError:
            self._metrics.count_error("upstream_timeout")
            raise _timeout(replica.replica_id) from None

    async def _relay_body(self, replica_id: str, upstream: aiohttp.ClientResponse) -> web.Response:
        try:
            data = await upstream.read()
        except TimeoutError:
            self._metrics.count_error("upstream_timeout")
            raise _timeout(replica_id) from None
        except aiohttp.ClientError as exc:
            self._metrics.count_error("upstream_broken")
            raise _upstream_failed(replica_id, f"the connection broke: {exc!r}") from None
        status = upstream.status
        if status >= 500:
            self._metrics.count_error("upstream_5xx")
            excerpt = data[:_EXCERPT_CHARS].decode("utf-8", "replace")
            raise _upstream_failed(replica_id, f"it answered HTTP {status}: {excerpt}")
        content_type = upstream.headers.get("Content-Type", "application/json")
        return web.Response(
            body=data,
            status=status,
            headers={"Content-Type": content_type, REPLICA_HEADER: replica_id},
        )

    async def _relay_stream(
        self, request: web.Request, replica_id: str, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=upstream.status,
            headers={
                "Content-Type": upstream.headers.get("Content-Type", "text/event-stream"),
                "Cache-Control": "no-cache",
                REPLICA_HEADER: replica_id,
            },
        )
        reader = upstream.content
        try:
            await response.prepare(request)
            while True:
                try:
                    chunk = await reader.readany()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    # Headers are gone already: the failure can only be told in-band.
                    self._metrics.count_error("upstream_interrupted")
                    message = f"replica {replica_id} stopped in the middle of the stream: {exc!r}"
                    await response.write(sse_error_event(message, code="upstream_interrupted"))
                    break
                if not chunk:
                    break
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            # The client went away; the caller's finally closes the upstream response,
            # which aborts the generation.
            self._metrics.count_error("client_disconnected")
        return response


def _forward_headers(incoming: Mapping[str, str]) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    for name in _FORWARDED_HEADERS:
        value = incoming.get(name)
        if value is not None:
            headers[name] = value
    return headers


def _timeout(replica_id: str) -> GatewayError:
    return GatewayError(
        504,
        f"replica {replica_id} did not answer in time",
        error_type=UPSTREAM,
        code="upstream_timeout",
        headers={REPLICA_HEADER: replica_id},
    )


def _upstream_failed(replica_id: str, why: str) -> GatewayError:
    return GatewayError(
        502,
        f"replica {replica_id} failed: {why}",
        error_type=UPSTREAM,
        code="upstream_error",
        headers={REPLICA_HEADER: replica_id},
    )
