"""The one way replicas arrive in, leave and change in the gateway, whoever runs them.

`join` is the pool's add (the path POST /admin/replicas takes); `leave` its drain-then-remove
(DELETE /admin/replicas/{id}); `lost` marks a replica down at once, for a process known to have
exited. The fleet side (`fleet.membership`) feeds it from a replica backend's watch: local
`up`, Ray, the autoscaler's added replicas and Kubernetes discovery all arrive through here.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from servepilot.gateway.kv_events import KvEventFeeds
from servepilot.gateway.kv_sources import ask_sources, endpoint_on
from servepilot.gateway.pool import DuplicateReplica, ReplicaNotFound, ReplicaPool

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, pool: ReplicaPool, kv_feeds: KvEventFeeds | None = None) -> None:
        self._pool = pool
        self._kv_feeds = kv_feeds

    async def join(
        self,
        replica_id: str,
        url: str,
        capacity: int | None = None,
        kv_events: tuple[int, int] | None = None,
    ) -> bool:
        """Add the replica (probed before it gets traffic); False, logged, if the pool has
        one by that id already (added by hand?). `kv_events`: the ports on its host where it
        publishes its KV events and replays them, followed when the gateway keeps an index."""
        try:
            await self._pool.add(replica_id, url, capacity)
        except DuplicateReplica:
            log.warning("replica %s (%s) is already in the pool (added by hand?)", replica_id, url)
            return False
        follow_kv_events(self._kv_feeds, self._pool, replica_id, url, kv_events)
        return True

    async def leave(self, replica_id: str, drain_timeout_s: float) -> None:
        """Stop routing to it, let its requests finish (up to `drain_timeout_s`), drop it; a
        replica no longer there (removed by hand, drained by the autoscaler) is left alone."""
        with contextlib.suppress(ReplicaNotFound):
            await self._pool.remove(replica_id, drain_timeout_s)

    def lost(self, replica_id: str, why: str) -> None:
        """Mark it down now: no health check rounds to wait for, no cold-start grace."""
        with contextlib.suppress(ReplicaNotFound):
            self._pool.mark_down(replica_id, why)

    def has(self, replica_id: str) -> bool:
        return any(r.replica_id == replica_id for r in self._pool.replicas())


def follow_kv_events(
    feeds: KvEventFeeds | None,
    pool: ReplicaPool,
    replica_id: str,
    url: str,
    ports: tuple[int, int] | None,
) -> None:
    """Where the gateway keeps an exact index: follow the replica's KV events at `ports` on
    its host, or, not given them, where the replica says it publishes (its /kv_event_sources)."""
    if feeds is None:
        return
    if ports is not None:
        feeds.subscribe(replica_id, endpoint_on(url, *ports))
    else:
        feeds.learn(replica_id, url, functools.partial(ask_sources, pool.session, url))
