"""How a proxied request ends: its last attempt's outcome as the client's answer, or as the
gateway's error for what the replica did (a failure, a 5xx, a 4xx in the gateway's shape)."""

from __future__ import annotations

from servepilot.gateway.errors import (
    INVALID_REQUEST,
    UPSTREAM,
    GatewayError,
    replica_error,
    sse_error_event,
)
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.gateway.relay import Outcome
from servepilot.gateway.replica import Replica
from servepilot.gateway.routes import ApiRoute, not_served_message
from servepilot.http1 import HttpRequest

REPLICA_HEADER = "X-Servepilot-Replica"
_EXCERPT_CHARS = 300


def deliver(
    request: HttpRequest,
    replica: Replica,
    outcome: Outcome,
    route: ApiRoute,
    model: str,
    metrics: GatewayMetrics,
) -> None:
    """End the request with its last attempt's `outcome`: a stream's end (or error event),
    the replica's answer, or the gateway's error for it (raised)."""
    replica_id = replica.replica_id
    if outcome.timed_out and not outcome.streamed:
        raise _timeout(replica_id)
    if outcome.failure is not None:  # after the head: only the stream can tell
        metrics.count_error("upstream_interrupted")
        message = f"replica {replica_id} stopped in the middle of the answer: {outcome.failure}"
        if outcome.streamed:
            if request.connected:
                request.end_stream(sse_error_event(message, code="upstream_interrupted"))
            return
        raise _upstream_failed(replica_id, message)
    if outcome.streamed:
        if request.connected:
            request.end_stream()
        return
    status = outcome.status
    if status >= 500:
        metrics.count_error("upstream_5xx")
        excerpt = outcome.body[:_EXCERPT_CHARS].decode("utf-8", "replace")
        raise _upstream_failed(replica_id, f"it answered HTTP {status}: {excerpt}")
    if status >= 400:
        raise _refused(status, outcome.body, route, model, replica_id)
    request.respond(status, outcome.body, outcome.content_type, (replica.header,))


def _refused(
    status: int, body: bytes, route: ApiRoute, model: str, replica_id: str
) -> GatewayError:
    """A replica's 4xx as the gateway's error: vLLM's own in the gateway's shape, any other
    answer quoted in a message of the gateway's."""
    headers = {REPLICA_HEADER: replica_id}
    own = replica_error(status, body, headers)
    if own is not None:
        return own
    answer = body[:_EXCERPT_CHARS].decode("utf-8", "replace")
    if status == 404:  # not vLLM's own 404 (an unknown model): the replica lacks the route
        message, code = not_served_message(route, model, replica_id, answer), "not_found"
    else:
        message, code = (
            f"replica {replica_id} answered HTTP {status}: {answer}",
            "upstream_client_error",
        )
    return GatewayError(status, message, error_type=INVALID_REQUEST, code=code, headers=headers)


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
