"""One streamed chat request through the gateway, and what it came to as the client saw it:
a complete stream, one ended by an SSE error event, an HTTP error, a broken stream or a hang.
Shared by the reliability tests (a killed replica, overload)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.integration.gatewayproc import openai_error

MODEL = "stub-model"
REPLICA_HEADER = "X-Servepilot-Replica"
DONE = b"data: [DONE]"
TOKEN = b'"content":" tok"'


CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello"}],
    "stream": True,
    "max_tokens": 16,
}


@dataclass
class Result:
    """What one streamed request came to, as the client saw it."""

    index: int
    sent_s: float
    status: int = 0
    replica: str | None = None
    kind: str = "pending"
    """complete | interrupted | http_error | broken | hang"""
    detail: str = ""
    head_s: float | None = None
    """Seconds from send to the response head."""
    first_token_s: float | None = None
    """Seconds from send to the first content token."""
    end_s: float | None = None
    tokens: int = 0
    dones: int = 0
    error: dict[str, Any] = field(default_factory=dict)
    retry_after: str | None = None


def classify(result: Result, body: bytes, chunks: int) -> None:
    """Fill `result.kind` from a 200 stream's body: a complete stream (one [DONE], last, every
    token there), or an SSE error event ending it; anything else is broken."""
    events = [e for e in body.split(b"\n\n") if e.strip()]
    result.dones = sum(1 for e in events if e.strip() == DONE)
    result.tokens = sum(1 for e in events if TOKEN in e)
    errors = [e for e in events if e.startswith(b'data: {"error"')]
    if result.dones == 1 and events[-1].strip() == DONE and not errors and result.tokens == chunks:
        result.kind = "complete"
    elif result.dones == 0 and len(errors) == 1 and events[-1] is errors[0]:
        result.error = openai_error(errors[0][len(b"data: ") :])
        result.kind = "interrupted"
    else:
        tail = body[-300:]
        result.kind = "broken"
        result.detail = f"{len(events)} events, {result.dones} [DONE], tail {tail!r}"


async def stream_one(
    session: aiohttp.ClientSession,
    url: str,
    result: Result,
    chunks: int,
    *,
    priority: int | None = None,
    api_key: str | None = None,
    timeout_s: float = 20.0,
) -> Result:
    """Send one streamed chat request and record its single outcome (never raises)."""
    headers = {} if priority is None else {"X-Priority": str(priority)}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                f"{url}/v1/chat/completions", json=CHAT, headers=headers
            ) as resp:
                result.head_s = time.perf_counter() - started
                result.status = resp.status
                result.replica = resp.headers.get(REPLICA_HEADER)
                result.retry_after = resp.headers.get("Retry-After")
                if resp.status != 200:
                    result.error = openai_error(await resp.read())
                    result.kind = "http_error"
                    return result
                body = b""
                async for piece in resp.content.iter_any():
                    if result.first_token_s is None and TOKEN in body + piece:
                        result.first_token_s = time.perf_counter() - started
                    body += piece
                result.end_s = time.perf_counter() - started
                classify(result, body, chunks)
    except TimeoutError:
        result.kind, result.detail = "hang", f"no complete answer within {timeout_s} s"
    except (aiohttp.ClientError, AssertionError) as exc:
        result.kind, result.detail = "broken", f"{type(exc).__name__}: {exc}"
    return result
