"""`/admin/replicas`: list, add, and drain-then-remove upstream replicas at run time; put one
to sleep or wake it (`/admin/replicas/{id}/sleep`, `/wake`: the warm pool, warm.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from servepilot.core.errors import EngineError
from servepilot.gateway.errors import INVALID_REQUEST, UPSTREAM, GatewayError, bad_request
from servepilot.gateway.kv_events import KvEventFeeds
from servepilot.gateway.membership import follow_kv_events
from servepilot.gateway.pool import DuplicateReplica, ReplicaNotFound, ReplicaPool
from servepilot.gateway.replica import ReplicaInfo, normalize_url
from servepilot.gateway.warm import SleepConflict, WarmPool
from servepilot.http1 import HttpRequest

DEFAULT_DRAIN_TIMEOUT_S = 30.0
# Ids appear in URLs (DELETE /admin/replicas/{id}) and as Prometheus label values.
_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_MAX_ADMIN_BODY_BYTES = 64 * 1024


class AdminHandlers:
    def __init__(
        self, pool: ReplicaPool, warm: WarmPool, kv_feeds: KvEventFeeds | None = None
    ) -> None:
        self._pool = pool
        self._warm = warm
        self._kv_feeds = kv_feeds

    async def replica_route(self, request: HttpRequest, rest: str) -> None:
        """`/admin/replicas/{rest}`: DELETE {id}, POST {id}/sleep or {id}/wake."""
        replica_id, _, action = rest.partition("/")
        if action not in _ACTIONS:
            raise GatewayError(404, f"no route {request.method} {request.path}",
                               error_type=INVALID_REQUEST, code="not_found")  # fmt: skip
        allowed = "DELETE" if action == "" else "POST"
        if request.method != allowed:
            raise GatewayError(405, f"{request.method} is not allowed on {request.path}",
                               error_type=INVALID_REQUEST, code="method_not_allowed",
                               headers={"Allow": allowed})  # fmt: skip
        await _ACTIONS[action](self, request, replica_id)

    async def sleep_replica(self, request: HttpRequest, replica_id: str) -> None:
        query = parse_qs(request.query)
        level = _parse_level(query.get("level", [None])[-1])
        timeout_s = _parse_timeout(query.get("timeout_s", [None])[-1])
        with _sleep_errors(replica_id):
            # Shielded: an admin client that leaves must not cut a transition in half.
            done = await asyncio.shield(self._warm.sleep(replica_id, level, timeout_s))
        _respond(request, 200, done.to_json())

    async def wake_replica(self, request: HttpRequest, replica_id: str) -> None:
        with _sleep_errors(replica_id):
            done = await asyncio.shield(self._warm.wake(replica_id))
        _respond(request, 200, done.to_json())

    async def list_replicas(self, request: HttpRequest) -> None:
        _respond(request, 200, [self._describe(info) for info in self._pool.replicas()])

    def _describe(self, info: ReplicaInfo) -> dict[str, Any]:
        """The replica's record; with an index, whether its prefix cache is known or guessed
        (and why guessed: "KV events are not flowing from r2")."""
        doc = info.to_json()
        if self._kv_feeds is not None:
            doc |= self._kv_feeds.describe(info.replica_id)
        return doc

    async def add_replica(self, request: HttpRequest) -> None:
        if len(request.body) > _MAX_ADMIN_BODY_BYTES:
            raise bad_request("the request body is too large for an admin request")
        added = _parse_add(request.body)
        try:
            info = await self._pool.add(
                added.replica_id or self._pool.new_id(),
                added.url,
                added.capacity,
                added.group,
                starting=added.starting,
            )
        except DuplicateReplica as exc:
            raise GatewayError(409, str(exc), error_type=INVALID_REQUEST, code="conflict") from None
        follow_kv_events(self._kv_feeds, self._pool, info.replica_id, info.url, added.kv_events)
        _respond(request, 201, self._describe(info))

    async def remove_replica(self, request: HttpRequest, replica_id: str) -> None:
        timeout_s = _parse_timeout(parse_qs(request.query).get("timeout_s", [None])[-1])
        try:
            drained = await self._pool.remove(replica_id, timeout_s)
        except ReplicaNotFound:
            raise _not_found(replica_id) from None
        _respond(request, 200, {"id": replica_id, "removed": True, "drained": drained})


_ACTIONS = {
    "": AdminHandlers.remove_replica,
    "sleep": AdminHandlers.sleep_replica,
    "wake": AdminHandlers.wake_replica,
}


def _not_found(replica_id: str) -> GatewayError:
    return GatewayError(404, f"no replica with id {replica_id!r}", error_type=INVALID_REQUEST,
                        code="replica_not_found")  # fmt: skip


@contextlib.contextmanager
def _sleep_errors(replica_id: str) -> Iterator[None]:
    """The warm pool's errors as answers: unknown id 404, wrong state 409, the replica's
    failure 502 (it is left as it was)."""
    try:
        yield
    except ReplicaNotFound:
        raise _not_found(replica_id) from None
    except SleepConflict as exc:
        raise GatewayError(409, str(exc), error_type=INVALID_REQUEST, code="conflict") from None
    except EngineError as exc:
        raise GatewayError(502, str(exc), error_type=UPSTREAM,
                           code="replica_sleep_failed") from None  # fmt: skip


def _parse_level(raw: str | None) -> int:
    if raw is None:
        return 1
    if raw not in ("1", "2"):
        raise bad_request("`level` must be 1 (weights kept in host memory) or 2 (dropped)")
    return int(raw)


def _respond(request: HttpRequest, status: int, doc: Any) -> None:
    request.respond(status, json.dumps(doc).encode())


@dataclass(frozen=True, slots=True)
class _NewReplica:
    replica_id: str | None
    url: str
    capacity: int | None
    group: str | None
    starting: bool
    kv_events: tuple[int, int] | None


def _parse_add(body: bytes) -> _NewReplica:
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        raise bad_request("the request body is not valid JSON", "invalid_json") from None
    if not isinstance(doc, dict):
        raise bad_request('expected a JSON object like {"id": "r3", "url": "http://host:port"}')
    url = doc.get("url")
    if not isinstance(url, str):
        raise bad_request("`url` (a string like http://host:port) is required", "missing_field")
    replica_id = doc.get("id")
    if replica_id is not None and (
        not isinstance(replica_id, str) or not _ID_PATTERN.fullmatch(replica_id)
    ):
        raise bad_request("`id` must be 1-64 letters, digits, '_', '.', ':' or '-'")
    capacity = doc.get("capacity")
    if capacity is not None and (
        not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1
    ):
        raise bad_request("`capacity` (requests in flight at most) must be an integer >= 1")
    group = doc.get("group")
    if group is not None and group not in ("short", "long"):
        raise bad_request('`group` must be "short" or "long" (length sharding)')
    starting = doc.get("starting", False)
    if not isinstance(starting, bool):
        raise bad_request("`starting` must be true (still loading: requests wait for it) or false")
    kv_events = _parse_kv_events(doc.get("kv_events"))
    return _NewReplica(replica_id, _normalized(url), capacity, group, starting, kv_events)


def _parse_kv_events(raw: Any) -> tuple[int, int] | None:
    """`{"publish": PORT, "replay": PORT}`: where on the replica's host vLLM publishes its KV
    events (--kv-events-config) and replays them."""
    if raw is None:
        return None
    ports: list[int] = []
    for key in ("publish", "replay"):
        port = raw.get(key) if isinstance(raw, dict) else None
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise bad_request('`kv_events` must be {"publish": PORT, "replay": PORT}')
        ports.append(port)
    return ports[0], ports[1]


def _normalized(url: str) -> str:
    try:
        return normalize_url(url)
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def _parse_timeout(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_DRAIN_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise bad_request("`timeout_s` must be a number of seconds >= 0")
    return value
