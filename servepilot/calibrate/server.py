"""What `servepilot calibrate` learns from a replica before probing it, and its counters.

Calibration measures one engine, so the target must be one vLLM server (not a gateway in
front of several): it needs vLLM's `/tokenize` for exact prompt lengths and vLLM's
`/metrics` counters to see prefix-cache hits and follow a wave's progress.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from servepilot.core.errors import ConfigError, EngineError
from servepilot.engine.metrics import EngineMetric, Scrape, scrape

PROBED = (
    EngineMetric.PREFIX_CACHE_HITS,
    EngineMetric.GENERATION_TOKENS,
    EngineMetric.PREFILL_TIME,
    EngineMetric.QUEUE_TIME,
)
"""What the probes read around each request and while a wave decodes."""
_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """The replica as it describes itself (None where it does not say)."""

    url: str
    model: str
    max_model_len: int | None
    version: str | None
    block_size: int | None
    num_blocks: int | None
    prefix_caching: bool | None

    @property
    def kv_tokens(self) -> int | None:
        if self.block_size is None or self.num_blocks is None:
            return None
        return self.block_size * self.num_blocks


def server_facts(root: str, model: str | None, api_key: str | None) -> ServerFacts:
    """Check that `root` is a vLLM server serving `model` (its only model when None)."""
    models = _get_json(root, "/v1/models", api_key)
    try:
        entries = {str(m["id"]): m for m in models["data"]}
    except (KeyError, TypeError):
        raise EngineError(
            f"{root}/v1/models is not an OpenAI model list",
            hint="--url must point at an OpenAI-compatible vLLM server",
        ) from None
    chosen = _choose_model(root, model, sorted(entries))
    metrics = scrape(_get_text(root, "/metrics", api_key))
    if not metrics.is_vllm():
        raise EngineError(
            f"{root} is not a vLLM server: its /metrics has no vllm: metrics",
            hint="calibrate one vLLM replica directly, not a gateway or another server",
        )
    info = metrics.info(EngineMetric.CACHE_CONFIG)
    version = _version(root, api_key)
    max_len = entries[chosen].get("max_model_len")
    return ServerFacts(
        url=root,
        model=chosen,
        max_model_len=int(max_len) if isinstance(max_len, int) else None,
        version=version,
        block_size=_int(info.get("block_size")),
        num_blocks=_int(info.get("num_gpu_blocks")),
        prefix_caching=_bool(info.get("enable_prefix_caching")),
    )


def _choose_model(root: str, model: str | None, served: list[str]) -> str:
    if model is not None:
        if model not in served:
            raise ConfigError(
                f"--model {model!r}: {root} does not serve it (it serves "
                f"{', '.join(served) or 'nothing'})"
            )
        return model
    if len(served) != 1:
        raise ConfigError(
            f"{root} serves {len(served)} models ({', '.join(served) or 'none'})",
            hint="pick one with --model",
        )
    return served[0]


def _request(root: str, path: str, api_key: str | None) -> bytes:
    request = urllib.request.Request(root + path)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as exc:
        hint = "check --api-key" if exc.code in (401, 403) else None
        raise EngineError(f"GET {root}{path} answered HTTP {exc.code}", hint=hint) from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EngineError(
            f"cannot reach {root} ({reason})",
            hint="check --url; is the replica running and ready?",
        ) from None


def _get_json(root: str, path: str, api_key: str | None) -> Any:
    body = _request(root, path, api_key)
    try:
        return json.loads(body)
    except ValueError:
        raise EngineError(
            f"GET {root}{path} did not answer JSON",
            hint="--url must point at an OpenAI-compatible vLLM server",
        ) from None


def _get_text(root: str, path: str, api_key: str | None) -> str:
    return _request(root, path, api_key).decode("utf-8", "replace")


def _version(root: str, api_key: str | None) -> str | None:
    try:
        doc = _get_json(root, "/version", api_key)
    except EngineError:
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return str(version) if version is not None else None


async def read_metrics(
    session: aiohttp.ClientSession, root: str, only: Sequence[EngineMetric] = PROBED
) -> Scrape:
    """The replica's /metrics page now: the metrics the probes read (or `only` these)."""
    async with session.get(f"{root}/metrics") as response:
        if response.status != 200:
            raise EngineError(f"GET {root}/metrics answered HTTP {response.status}")
        return scrape(await response.text(), only)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _bool(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() == "true"
