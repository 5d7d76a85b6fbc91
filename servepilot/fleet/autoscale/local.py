"""The local backend: the autoscaler's replicas are more child processes of `up`, launched by
the same code as the first ones (`fleet.local.LocalReplicas`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from servepilot.engine.process import ReplicaInfo, ReplicaProcess
from servepilot.fleet.autoscale.waits import StartWaits
from servepilot.fleet.local import LocalReplicas

log = logging.getLogger(__name__)


class LocalScaling:
    """Launches a replica process and, once it is ready, hands it to `join` (which adds it to
    the gateway); stops one the controller has drained. A replica that fails to start is
    logged and stopped; the controller sees one fewer and decides again."""

    def __init__(
        self, replicas: LocalReplicas, join: Callable[[ReplicaInfo], Awaitable[None]]
    ) -> None:
        self._replicas = replicas
        self._join = join
        self._waits = StartWaits()

    def starting(self) -> tuple[str, ...]:
        return self._waits.ids()

    def remove_first(self) -> frozenset[str]:
        return frozenset()  # every local replica is alike: newest first

    async def add(self) -> str:
        proc = self._replicas.launch_one()
        rid = proc.replica_id
        if (line := self._replicas.wait_line(rid)) is not None:
            log.info("autoscale: %s", line)
        self._waits.start(rid, self._join_when_ready(proc))
        return rid

    async def _join_when_ready(self, proc: ReplicaProcess) -> None:
        rid = proc.replica_id
        try:
            # Through the replicas: one sharing a GPU starts once its neighbour is ready.
            info = await self._replicas.ready_one(proc)
            # Joined before it stops counting as starting: the controller never sees it gone.
            await self._join(info)
            log.info("autoscale: replica %s ready in %.0f s, in the gateway", rid, info.startup_s)
        except Exception as exc:  # EngineStartError, or the gateway refused it
            log.warning("autoscale: replica %s did not start: %s", rid, exc)
            await self._replicas.stop_one(rid)
        finally:
            self._waits.discard(rid)

    async def remove(self, replica_id: str) -> None:
        await self._waits.cancel(replica_id)
        await self._replicas.stop_one(replica_id)

    async def close(self) -> None:
        await self._waits.cancel_all()
