"""The verdict on what a server's answer held, for `wire.Connection`: OpenAI's stream shapes,
refusals and their Retry-After. Pure functions (the HTTP framing is servepilot.http1's)."""

from __future__ import annotations

import json

from servepilot.bench.sse import EventScanner, error_message, excerpt

REFUSALS = (429, 503)
"""Statuses with which a server sheds load; with Retry-After they say when to come back."""


def retry_after_s(raw: bytes | None) -> float | None:
    """Retry-After in seconds when given as delta-seconds (an HTTP date is not followed)."""
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def text(raw: bytes | None) -> str | None:
    return raw.decode("latin-1") if raw is not None else None


def why(exc: BaseException | None, default: str) -> str:
    return f"{default}: {exc}" if exc is not None else default


def stream_verdict(scanner: EventScanner) -> tuple[str | None, str]:
    if scanner.error is not None:
        return scanner.error, scanner.detail
    if not scanner.chunks:
        return "no_content", f"the stream ended after {scanner.events} events, none with content"
    return None, ""


def body_verdict(status: int, body: bytes) -> tuple[str | None, str]:
    """The verdict on an answer that was not an event stream (an error, HTML, plain JSON)."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if status != 200:
        return f"http_{status}", error_message(obj) or excerpt(body)
    if isinstance(obj, dict) and "choices" in obj:
        return "not_streamed", "the server answered with one JSON body instead of a stream"
    return "not_openai", f"not an event stream: {excerpt(body) or '(empty body)'}"
