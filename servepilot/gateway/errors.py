"""OpenAI-shaped error responses: `{"error": {"message", "type", "code"}}`.

Handlers raise `GatewayError`; the app turns it (and anything unexpected) into one of these
JSON bodies, so a client never sees an HTML page or a bare traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
UNAVAILABLE = "service_unavailable_error"
UPSTREAM = "upstream_error"
INTERNAL = "internal_error"
OVERLOADED = "rate_limit_error"
AUTH = "authentication_error"


class UpstreamFailed(ConnectionError):
    """The replica could not be reached, or the connection broke (a plain Python class:
    mypyc compiles no subclass of a builtin exception but Exception)."""


class GatewayError(Exception):
    """An error the gateway answers with, as an HTTP status and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str,
        code: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        return error_body(self.message, error_type=self.error_type, code=self.code)

    def header_pairs(self) -> list[tuple[bytes, bytes]]:
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]


def error_body(message: str, *, error_type: str, code: str) -> bytes:
    payload = {"error": {"message": message, "type": error_type, "code": code}}
    return json.dumps(payload).encode()


def client_error_from_replica(status: int, body: bytes, replica_id: str) -> bytes | None:
    """A replica's 4xx body in the OpenAI shape every gateway error has, or None when it has
    it already (vLLM's own answers: relayed as they are). A replica that is not vLLM, or a
    route vLLM leaves to its web framework (`{"detail": "Not Found"}`), answers otherwise."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error.get("type"):
        return None
    excerpt = body[:300].decode("utf-8", "replace")
    return error_body(
        f"replica {replica_id} answered HTTP {status}: {excerpt}",
        error_type=INVALID_REQUEST,
        code="not_found" if status == 404 else "upstream_client_error",
    )


def server_error_body(status: int, message: str, code: str) -> bytes:
    """The body of an answer the HTTP server gives on its own (http1.ErrorBody): a request
    it could not parse or accept, or one the gateway failed to answer."""
    error_type = INTERNAL if status >= 500 else INVALID_REQUEST
    return error_body(message, error_type=error_type, code=code)


def bad_request(message: str, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, error_type=INVALID_REQUEST, code=code)


def shed(message: str, code: str, retry_after_s: int) -> GatewayError:
    """429: the gateway refuses work to protect the latency of the rest."""
    return GatewayError(
        429,
        message,
        error_type=OVERLOADED,
        code=code,
        headers={"Retry-After": str(retry_after_s)},
    )


def no_ready_replica(retry_after_s: int) -> GatewayError:
    return GatewayError(
        503,
        "no replica is ready to serve this request; retry later",
        error_type=UNAVAILABLE,
        code="no_ready_replica",
        headers={"Retry-After": str(retry_after_s)},
    )


def sse_error_event(message: str, *, code: str) -> bytes:
    """A server-sent event carrying an error, for failures after a stream has started."""
    return b"data: " + error_body(message, error_type=UPSTREAM, code=code) + b"\n\n"
