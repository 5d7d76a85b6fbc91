"""OpenAI-shaped error responses: `{"error": {"message", "type", "code"}}`.

Handlers raise `GatewayError`; the app turns it (and anything unexpected) into one of these
JSON bodies, so a client never sees an HTML page or a bare traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
UNAVAILABLE = "service_unavailable_error"
UPSTREAM = "upstream_error"
INTERNAL = "internal_error"
OVERLOADED = "rate_limit_error"
AUTH = "authentication_error"
_CLIENT_ERROR_TYPES = {401: AUTH, 403: AUTH, 429: OVERLOADED}
"""The gateway's error type of a replica's 4xx, by status (the rest: INVALID_REQUEST)."""
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


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


def replica_error(status: int, body: bytes, headers: Mapping[str, str]) -> GatewayError | None:
    """A replica's own 4xx answer in the shape of the gateway's errors, or None when its body
    is not vLLM's error (another server, or a route vLLM leaves to its web framework:
    `{"detail": "Not Found"}`). vLLM's message is kept; its `code` is the HTTP status again
    and its `type` a class name (BadRequestError), so the type becomes the code (bad_request)
    and the type is the gateway's for the status: one shape whoever refused."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    error = doc.get("error")
    if not isinstance(error, dict):  # vLLM before 0.8 put the fields at the top
        error = doc if doc.get("object") == "error" else {}
    message, kind, code = error.get("message"), error.get("type"), error.get("code")
    if not isinstance(message, str) or not isinstance(kind, str) or not kind:
        return None
    if not isinstance(code, str) or not code:
        code = _snake(kind).removesuffix("_error") or "upstream_client_error"
    return GatewayError(status, message, error_type=_CLIENT_ERROR_TYPES.get(status,
                        INVALID_REQUEST), code=code, headers=headers)  # fmt: skip


def _snake(name: str) -> str:
    """BadRequestError -> bad_request_error."""
    return _CAMEL_BOUNDARY.sub("_", name).lower()


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
