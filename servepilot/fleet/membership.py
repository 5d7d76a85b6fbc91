"""The one membership path: a replica backend's watch, applied to the gateway's membership.

`MembershipFeed` owns one task that reads the watch. A `Joined` is applied in line (the
replica is in the pool, probed, when the event is done); a `Left` drains in a task of its own
so that a slow drain holds up no other replica; an event for a replica with a change still
under way waits for that change (a Ray replica restarted at a new URL leaves, then joins).
`stop()` cancels the reader and the changes under way, then awaits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from servepilot.core.loop import cancel_all_and_wait
from servepilot.fleet.backend import Joined, Left, Lost, ReplicaBackend, ReplicaEvent, Synced
from servepilot.gateway.membership import Membership

log = logging.getLogger(__name__)


class MembershipFeed:
    def __init__(
        self,
        events: AsyncIterator[ReplicaEvent],
        membership: Membership,
        on_event: Callable[[ReplicaEvent], None] | None = None,
    ) -> None:
        """`on_event` hears each event once it is applied (`up` warns of a lost replica)."""
        self._events = events
        self._membership = membership
        self._on_event = on_event
        self._joined: set[str] = set()
        self._pending: dict[str, asyncio.Task[None]] = {}
        """The change still under way for each replica (a drain, or a join waiting on one)."""
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def joined(self) -> frozenset[str]:
        """The replicas this feed has in the gateway (those leaving excluded)."""
        return frozenset(self._joined)

    async def start(self) -> None:
        """Read the watch in the background; return once the replicas serving now are in the
        gateway (the watch said `Synced`), so that /ready is right from the first request."""
        self._task = asyncio.ensure_future(self._run())
        synced = asyncio.ensure_future(self._synced.wait())
        try:
            await asyncio.wait({self._task, synced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            synced.cancel()
        if self._task.done():
            self._task.result()  # the watch ended or failed before it synced: say why

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._pending.values()) if t is not None]
        await cancel_all_and_wait(tasks)
        self._task = None
        self._pending.clear()

    async def apply(self, event: ReplicaEvent) -> None:
        match event:
            case Joined(replica_id=rid):
                self._joined.add(rid)
                await self._after_pending(rid, lambda: self._join(event))
            case Left(replica_id=rid, drain_timeout_s=timeout_s):
                self._joined.discard(rid)
                self._chain(rid, lambda: self._membership.leave(rid, timeout_s))
            case Lost(replica_id=rid, why=why):
                self._membership.lost(rid, why)
            case Synced():
                self._synced.set()
        if self._on_event is not None:
            self._on_event(event)

    async def _run(self) -> None:
        async for event in self._events:
            await self.apply(event)

    async def _join(self, event: Joined) -> None:
        ports = event.kv_events
        kv_events = None if ports is None else (ports.publish, ports.replay)
        if not await self._membership.join(event.replica_id, event.url, event.capacity, kv_events):
            self._joined.discard(event.replica_id)
            return
        log.info("replica %s joined the gateway (%s)", event.replica_id, event.url)

    async def _after_pending(self, rid: str, change: Callable[[], Awaitable[None]]) -> None:
        """In line when nothing is under way for `rid`; else chained after it."""
        if rid in self._pending:
            self._chain(rid, change)
        else:
            await change()

    def _chain(self, rid: str, change: Callable[[], Awaitable[None]]) -> None:
        before = self._pending.get(rid)

        async def run() -> None:
            if before is not None:
                with contextlib.suppress(Exception):  # logged where it failed
                    await before
            await change()

        task = asyncio.ensure_future(run())
        self._pending[rid] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._pending.get(rid) is finished:
                del self._pending[rid]

        task.add_done_callback(done)


@contextlib.asynccontextmanager
async def following(
    backend: ReplicaBackend,
    membership: Membership,
    on_event: Callable[[ReplicaEvent], None] | None = None,
) -> AsyncIterator[MembershipFeed]:
    """The gateway's membership fed from `backend`'s watch while inside (synced on entry)."""
    feed = MembershipFeed(backend.watch(), membership, on_event)
    try:
        await feed.start()
        yield feed
    finally:
        await feed.stop()
