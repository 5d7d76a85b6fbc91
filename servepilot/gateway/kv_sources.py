"""Where a replica publishes its KV events, as the replica itself says: vLLM's
`GET /kv_event_sources`.

A replica given to the gateway without its event ports (`servepilot gateway --replica URL`,
POST /admin/replicas without `kv_events`) is asked. vLLM answers with its `KVEventsConfig` per
data-parallel rank, `{}` when it publishes none:

    {"0": {"enable_kv_cache_events": true, "publisher": "zmq",
           "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", ...}}

The sockets are bound on the replica's host, so a wildcard address (`*`, 0.0.0.0, ::) means
the host the gateway reaches the replica at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp
from yarl import URL

SOURCES_PATH = "/kv_event_sources"
_ASK_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
_WILDCARDS = frozenset({"*", "0.0.0.0", "::", ""})


@dataclass(frozen=True, slots=True)
class KvEventsEndpoint:
    """Where one replica publishes: its PUB socket and its replay ROUTER socket."""

    publish: str
    replay: str


@dataclass(frozen=True, slots=True)
class NoKvEvents:
    """The replica answered, and its events cannot be followed: why (what `status` shows)."""

    why: str


def endpoint_from_sources(
    replica_id: str, url: str, status: int, body: bytes
) -> KvEventsEndpoint | NoKvEvents | None:
    """The replica's publisher and replay sockets from its answer to GET /kv_event_sources;
    NoKvEvents when it publishes none (or none the index can follow); None when the answer
    says nothing yet (a server error: ask again later)."""
    if status == 404:
        return NoKvEvents(
            f"{replica_id} has no {SOURCES_PATH} (vLLM before 0.32, or not vLLM): give its "
            "KV event ports to POST /admin/replicas as kv_events"
        )
    if status != 200:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return NoKvEvents(f"{replica_id}'s {SOURCES_PATH} answer is not a JSON object")
    if not doc:
        return NoKvEvents(
            f"{replica_id} publishes no KV events (started without --kv-events-config)"
        )
    if len(doc) > 1:
        return NoKvEvents(
            f"{replica_id} is data-parallel ({len(doc)} ranks, each publishing apart): its "
            "prefix cache is guessed"
        )
    source = next(iter(doc.values()))
    if not isinstance(source, dict) or not source.get("enable_kv_cache_events"):
        return NoKvEvents(f"{replica_id} publishes no KV events (enable_kv_cache_events off)")
    publisher, publish, replay = (
        source.get(k) for k in ("publisher", "endpoint", "replay_endpoint")
    )
    if publisher != "zmq" or not isinstance(publish, str):
        return NoKvEvents(f"{replica_id} publishes its KV events by {publisher!r}, not ZMQ")
    if not isinstance(replay, str):
        return NoKvEvents(
            f"{replica_id} publishes its KV events without a replay socket (replay_endpoint), "
            "which the gateway needs to catch up after a gap"
        )
    return KvEventsEndpoint(_seen_from(publish, url), _seen_from(replay, url))


def endpoint_on(url: str, publish_port: int, replay_port: int) -> KvEventsEndpoint:
    """The endpoints of a replica serving at `url` that publishes on those ports."""
    host = _zmq_host(url)
    return KvEventsEndpoint(f"tcp://{host}:{publish_port}", f"tcp://{host}:{replay_port}")


def _seen_from(endpoint: str, url: str) -> str:
    """`endpoint` as the gateway connects to it: a TCP wildcard becomes the replica's host."""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or host.strip("[]") not in _WILDCARDS:
        return endpoint  # a named host, or ipc:// (the same machine): as it is
    return f"tcp://{_zmq_host(url)}:{port}"


def _zmq_host(url: str) -> str:
    host = URL(url).host or "127.0.0.1"
    return f"[{host}]" if ":" in host else host  # an IPv6 address goes in brackets in ZMQ too


async def ask_sources(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes] | None:
    """GET the replica's /kv_event_sources: its status and body, None when it gave none in
    time (still loading, or gone)."""
    try:
        async with session.get(url.rstrip("/") + SOURCES_PATH, timeout=_ASK_TIMEOUT) as resp:
            return resp.status, await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        return None
