"""Replicas the gateway finds by itself: a source of endpoints (one method) and the watcher that
keeps the pool in step with it.

The watcher owns one background task. Each pass lists the endpoints; a ready one the pool does
not have joins through the pool's add (the path POST /admin/replicas takes); one that turned
not ready or disappeared leaves through the drain-then-remove of DELETE /admin/replicas/{id}.
A failed listing changes nothing: a blip of the API server must not empty the pool. `stop()`
cancels the task and the drains in progress, then awaits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Protocol

from servepilot.core.errors import ServepilotError
from servepilot.core.loop import cancel_all_and_wait
from servepilot.gateway.pool import DuplicateReplica, ReplicaNotFound, ReplicaPool

log = logging.getLogger(__name__)

DISCOVERY_INTERVAL_S = 2.0


class DiscoveryError(ServepilotError):
    """The endpoints could not be listed (the source says why)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    ip: str
    port: int
    ready: bool
    pod: str | None = field(default=None, compare=False)
    """The pod behind it, where the source knows (Kubernetes: the EndpointSlice's targetRef)."""

    @property
    def replica_id(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


class EndpointSource(Protocol):
    async def list_endpoints(self) -> list[Endpoint]:
        """Every endpoint of the replicas now, ready or not; DiscoveryError if unknown."""
        ...


class EndpointWatcher:
    def __init__(
        self,
        pool: ReplicaPool,
        source: EndpointSource,
        *,
        interval_s: float = DISCOVERY_INTERVAL_S,
        drain_timeout_s: float = 30.0,
    ) -> None:
        self._pool = pool
        self._source = source
        self._interval_s = interval_s
        self._drain_timeout_s = drain_timeout_s
        self._joined: set[str] = set()
        """Replica ids this watcher added and has not started removing."""
        self._leaving: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def replica_ids(self) -> frozenset[str]:
        """The replicas the watcher has in the pool (draining ones excluded)."""
        return frozenset(self._joined)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        await cancel_all_and_wait(t for t in (self._task, *self._leaving.values()) if t is not None)
        self._task = None
        self._leaving.clear()

    async def sync(self) -> None:
        """One pass: list the endpoints and make the pool follow them."""
        try:
            endpoints = await self._source.list_endpoints()
        except DiscoveryError as exc:
            log.warning("discovery: %s; the replicas stay as they were", exc)
            return
        ready = {e.replica_id: e for e in endpoints if e.ready}
        for replica_id in sorted(self._joined - ready.keys()):
            self._joined.discard(replica_id)
            self._leaving[replica_id] = asyncio.ensure_future(self._leave(replica_id))
        for replica_id, endpoint in sorted(ready.items()):
            if replica_id not in self._joined and replica_id not in self._leaving:
                await self._join(endpoint)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.sync()

    async def _join(self, endpoint: Endpoint) -> None:
        try:
            await self._pool.add(endpoint.replica_id, endpoint.url)
        except DuplicateReplica:
            log.warning("discovery: %s is already in the pool (added by hand?)", endpoint.url)
            return
        self._joined.add(endpoint.replica_id)
        log.info("discovery: replica %s joined", endpoint.replica_id)

    async def _leave(self, replica_id: str) -> None:
        try:
            with contextlib.suppress(ReplicaNotFound):  # removed by hand meanwhile
                await self._pool.remove(replica_id, self._drain_timeout_s)
            log.info("discovery: replica %s left", replica_id)
        finally:
            self._leaving.pop(replica_id, None)
