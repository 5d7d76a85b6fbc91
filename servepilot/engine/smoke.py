"""A replica's smoke generation: the second half of readiness. /health says the server runs;
only a completion that returns tokens says the model loaded and the engine steps."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp

SMOKE_PROMPT = "Hello"
SMOKE_MAX_TOKENS = 2
SMOKE_TIMEOUT_S = 60.0
"""The first generation on a GPU may wait for lazily compiled kernels: a minute, not seconds."""


class SmokeFailure(Exception):
    """The replica answered /health but did not generate (the message says how it failed)."""


@dataclass(frozen=True, slots=True)
class SmokeResult:
    model: str
    completion_tokens: int
    elapsed_s: float


async def smoke_generation(url: str, timeout_s: float = SMOKE_TIMEOUT_S) -> SmokeResult:
    """Ask the replica at `url` for SMOKE_MAX_TOKENS tokens of its first model; raise
    SmokeFailure unless at least one comes back within `timeout_s`."""
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            model = await _first_model(session, url)
            body = {
                "model": model,
                "prompt": SMOKE_PROMPT,
                "max_tokens": SMOKE_MAX_TOKENS,
                "temperature": 0.0,
            }
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise SmokeFailure(f"/v1/completions answered {resp.status}: {text[:200]}")
                answer = await resp.json(content_type=None)
    except TimeoutError:
        raise SmokeFailure(f"no answer within {timeout_s:.0f} s") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise SmokeFailure(f"{type(exc).__name__}: {exc}") from None
    tokens = _completion_tokens(answer)
    if tokens < 1:
        raise SmokeFailure(f"/v1/completions returned no tokens: {str(answer)[:200]}")
    return SmokeResult(model, tokens, time.monotonic() - started)


async def _first_model(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/v1/models") as resp:
        if resp.status != 200:
            raise SmokeFailure(f"/v1/models answered {resp.status}")
        listing = await resp.json(content_type=None)
    models = listing.get("data") if isinstance(listing, dict) else None
    if not models:
        raise SmokeFailure("/v1/models lists no model")
    return str(models[0]["id"])


def _completion_tokens(answer: Any) -> int:
    """usage.completion_tokens when reported, else 1 per choice that carries text."""
    if not isinstance(answer, dict):
        return 0
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    texts = [c.get("text") or (c.get("message") or {}).get("content") for c in answer["choices"]]
    return sum(1 for t in texts if t)
