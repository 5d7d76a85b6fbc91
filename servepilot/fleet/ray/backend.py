"""Ray as a `ReplicaBackend`: the replicas are actors in placement groups (`RayReplicas`), the
first ones placed together; one added later is placed as `scaling.RayScaling` says. The watch
is the replica watcher's (`watcher.ReplicaWatcher`): a replica joins once its actor's server
is ready, and leaves when Ray loses it (drained for `LEAVE_DRAIN_S`: its server is gone), to
join again, maybe at a new URL, when Ray has restarted it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.backend import Joined, Left, Replica, ReplicaEvent, ReplicaState, Synced
from servepilot.fleet.logs import replica_log_name
from servepilot.fleet.ray.actor import ActorReady
from servepilot.fleet.ray.replicas import RayReplicas
from servepilot.fleet.ray.scaling import RayScaling
from servepilot.fleet.ray.watcher import LEAVE_DRAIN_S, ReplicaWatcher
from servepilot.fleet.serve import replica_budget


class RayBackend:
    """`warn` and `step` say what happens to the replicas (on `up`'s output)."""

    def __init__(
        self,
        replicas: RayReplicas,
        warn: Callable[[str], None],
        step: Callable[[str], None],
    ) -> None:
        self.replicas = replicas
        self._queues: list[asyncio.Queue[ReplicaEvent]] = []
        self.watcher = ReplicaWatcher(replicas.replicas, _Publish(self), warn, step)
        self._scaling = RayScaling(replicas, self.watcher, warn)
        self._launched = False
        self._watching = False

    @property
    def sleep_mode(self) -> bool:
        # The gateway sleeps and wakes them through their own URLs, as it does local ones.
        return self.replicas.config.engine.sleep_mode

    async def start(self, count: int = 1) -> tuple[str, ...]:
        if not self._launched:
            # The first replicas: replicas.count of them, as the placement plan has them.
            self._launched = True
            await self.replicas.launch()
            return tuple(r.replica_id for r in self.replicas.replicas)
        return tuple([await self._scaling.add() for _ in range(count)])

    async def wait_started(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        return await self.replicas.wait_ready(on_ready)

    async def stop(self, replica_id: str) -> None:
        await self._scaling.remove(replica_id)

    async def stop_all(self) -> None:
        await self.watcher.stop()
        await self.replicas.stop()

    async def close(self) -> None:
        await self._scaling.close()

    def list(self) -> tuple[Replica, ...]:
        if not self._launched:  # the replicas planned, not placed yet
            ids = self.replicas.replica_ids
        else:  # the autoscaler may add or remove one meanwhile
            ids = [r.replica_id for r in list(self.replicas.replicas)]
        return tuple(self._replica(rid) for rid in ids)

    def _replica(self, replica_id: str) -> Replica:
        answer = self.watcher.answers.get(replica_id) or self.replicas.answers.get(replica_id)
        info = answer.info if answer is not None else None
        state = self.watcher.states.get(replica_id, ReplicaState.STARTING)
        return Replica(
            replica_id,
            info.url if info is not None else "",
            state,
            log_path=str(self.replicas.run_dir / replica_log_name(replica_id)),
            where=answer.node_id if answer is not None else "",
            remove_first=replica_id in self._scaling.remove_first(),
        )

    async def watch(self) -> AsyncIterator[ReplicaEvent]:
        if self._watching:
            raise RuntimeError("the Ray backend has one watch")
        self._watching = True
        queue: asyncio.Queue[ReplicaEvent] = asyncio.Queue()
        self._queues.append(queue)
        joined = dict(self.replicas.answers)
        self.watcher.start(joined)  # those are in the gateway once the events below are
        for replica_id, answer in joined.items():
            yield self._joined(replica_id, answer)
        yield Synced()
        while True:
            yield await queue.get()

    def _joined(self, replica_id: str, answer: ActorReady) -> Joined:
        assert answer.info is not None
        config = self.replicas.config
        info = answer.info
        return Joined(replica_id, info.url, replica_budget(config, info), info.kv_events)

    def publish(self, event: ReplicaEvent) -> None:
        for queue in self._queues:
            queue.put_nowait(event)


class _Publish:
    """The watcher's joins and leaves as the backend's watch events."""

    def __init__(self, backend: RayBackend) -> None:
        self._backend = backend

    async def join(self, replica_id: str, answer: ActorReady) -> None:
        self._backend.publish(self._backend._joined(replica_id, answer))

    async def leave(self, replica_id: str) -> None:
        self._backend.publish(Left(replica_id, LEAVE_DRAIN_S, "lost"))
