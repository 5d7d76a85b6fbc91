"""The client side of HTTP/1.1 framing, for `wire.Connection`: reading a server's answer
(status line, headers, chunked body) and the verdict on what it held. Pure functions on bytes.

Not servepilot.http1, which is the server side (parsing requests with llhttp, writing
answers): this decodes answers, with fast paths tuned for a benchmark client's CPU, and its
verdicts speak OpenAI's stream shapes."""

from __future__ import annotations

import json
from itertools import repeat

from servepilot.bench.sse import EventScanner, error_message, excerpt


class BadHttp(Exception):
    pass


def dechunk(data: bytes) -> tuple[bytes, bool] | None:
    """(body, ended) of a read of whole chunks, decoded in a few C-level passes; None when
    the read does not end on a chunk boundary or is anything unusual (the exact loop then
    decodes it). Each chunk's size is checked against its data, so a CRLF inside a chunk's
    data cannot be mistaken for framing: the first such chunk would not match its size."""
    eol = data.find(b"\r\n")
    if 0 < eol < 9:  # one chunk per read is the usual streamed token
        try:
            size = int(data[:eol], 16)
        except ValueError:
            return None
        if size and len(data) == eol + size + 4 and data.endswith(b"\r\n"):
            return data[eol + 2 : -2], False
    ended = data.endswith(b"0\r\n\r\n") and (len(data) == 5 or data[-7:-5] == b"\r\n")
    if ended:
        data = data[:-5]
    parts = data.split(b"\r\n")
    if parts[-1] or not len(parts) & 1:
        return None
    pieces = parts[1:-1:2]
    try:
        sizes = list(map(int, parts[0:-1:2], repeat(16)))
    except ValueError:
        return None
    if sizes != list(map(len, pieces)) or 0 in sizes:
        return None
    return b"".join(pieces), ended


def status_of(head: bytes) -> int:
    try:
        return int(head[9:12])
    except ValueError:
        line = head.split(b"\r\n", 1)[0]
        raise BadHttp(f"bad status line: {excerpt(line, 80)}") from None


def header(lower: bytes, source: bytes, name: bytes) -> bytes | None:
    """The value of header `name` (lower-case) in a head; `source` gives its original case."""
    at = lower.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    end = lower.find(b"\r\n", start)
    return source[start : end if end >= 0 else len(source)].strip()


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


def number(raw: bytes, base: int) -> int:
    try:
        value = int(raw.strip(), base)
    except ValueError:
        raise BadHttp(f"bad number in the framing: {excerpt(raw, 40)}") from None
    if value < 0:
        raise BadHttp(f"negative length: {value}")
    return value


def text(raw: bytes | None) -> str | None:
    return raw.decode("latin-1") if raw is not None else None


def why(exc: Exception | None, default: str) -> str:
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
