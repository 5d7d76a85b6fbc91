"""What the server served from its prefix cache during a level, read from its own counters.

A random workload's prompts follow from `--seed`, and every level of seed s sends the prompts
of seed s + its index: a second bench against the same replicas with the same seed sends
prompts they have seen, and vLLM's prefix cache (on by default) skips their prefill. Its TTFT
and throughput are then not those of new traffic. bench reads vLLM's `prefix_cache_queries`
and `prefix_cache_hits` (tokens) before and after each level, summed over the replicas: the
target itself, or, behind a servepilot gateway, every replica its `/admin/replicas` lists. The
counters are the replicas' own: other clients' traffic during the level counts too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from servepilot.core.errors import EngineError
from servepilot.engine.metrics import EngineMetric, scrape

_COUNTERS = (EngineMetric.PREFIX_CACHE_QUERIES, EngineMetric.PREFIX_CACHE_HITS)
_TIMEOUT = aiohttp.ClientTimeout(total=5)


@dataclass(frozen=True, slots=True)
class CacheCount:
    """The replicas' prefix-cache counters at one moment, summed."""

    queries_tokens: float
    hits_tokens: float


def hit_rate(before: CacheCount | None, after: CacheCount | None) -> float | None:
    """The share of prompt tokens looked up between two readings that the cache held; None
    without both readings or without a lookup (a replica restarted: its counters went back)."""
    if before is None or after is None:
        return None
    queries = after.queries_tokens - before.queries_tokens
    hits = after.hits_tokens - before.hits_tokens
    if queries <= 0 or hits < 0:
        return None
    return hits / queries


async def read_cache(base_url: str) -> CacheCount | None:
    """The counters of the replicas behind `base_url`; None where none exports them (not a
    vLLM, a gateway whose replicas cannot be listed, the server unreachable)."""
    try:
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            urls = await _replica_urls(session, base_url)
            counts = [await _count(session, url) for url in urls]
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    found = [c for c in counts if c is not None]
    if not found:
        return None
    return CacheCount(sum(c.queries_tokens for c in found), sum(c.hits_tokens for c in found))


async def _replica_urls(session: aiohttp.ClientSession, base_url: str) -> Sequence[str]:
    """A servepilot gateway's replicas, or the target alone."""
    async with session.get(f"{base_url}/admin/replicas") as resp:
        if resp.status != 200:
            return (base_url,)
        listed = await resp.json(content_type=None)
    if not isinstance(listed, list):
        return (base_url,)
    return tuple(str(r["url"]).rstrip("/") for r in listed if isinstance(r, dict) and r.get("url"))


async def _count(session: aiohttp.ClientSession, url: str) -> CacheCount | None:
    async with session.get(f"{url}/metrics") as resp:
        if resp.status != 200:
            return None
        text = await resp.text()
    try:
        page = scrape(text, only=_COUNTERS)
    except EngineError:
        return None
    if not page.has(EngineMetric.PREFIX_CACHE_QUERIES):
        return None
    return CacheCount(
        page.total(EngineMetric.PREFIX_CACHE_QUERIES), page.total(EngineMetric.PREFIX_CACHE_HITS)
    )
