"""The Ray backend's adds and removes (`backend.RayBackend`, for the autoscaler): a replica added
is one more actor, started as `up` starts the first ones (`RayReplicas`), and joins the gateway
through the watcher, as they do; a replica removed, once the controller drained it, loses its
actor and its placement group.

Under `spread` the first replicas share one STRICT_SPREAD group, which cannot grow: an added
replica reuses a bundle a removed one left (its node holds no other replica), else gets a
STRICT_PACK group of its own aimed (Ray's soft target) at a node with room that holds no
replica. With no such node the group goes wherever Ray finds room, next to a replica, and a
warning says so; a group not placed within cluster.placement_timeout_s is removed with its
replica (the controller sees one fewer and decides again), as is a replica whose server fails to
start or is not ready in time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from servepilot.fleet.autoscale.waits import StartWaits
from servepilot.fleet.backend import ReplicaState
from servepilot.fleet.ray import cluster
from servepilot.fleet.ray.groups import group_state, wait_placed
from servepilot.fleet.ray.placement import NodeResources, node_for_added_replica
from servepilot.fleet.ray.replicas import ACTOR_START_S, RayReplica, RayReplicas
from servepilot.fleet.ray.watcher import ReplicaWatcher

# How often a starting replica's state is looked at (the watcher moves it).
_POLL_S = 0.2


class RayScaling:
    """Adds and removes replica actors for the controller; `warn` says what went wrong (on
    `up`'s output)."""

    def __init__(
        self, replicas: RayReplicas, watcher: ReplicaWatcher, warn: Callable[[str], None]
    ) -> None:
        self._replicas = replicas
        self._watcher = watcher
        self._warn = warn
        self._waits = StartWaits()
        self._sharing: set[str] = set()
        """Added replicas placed on a node that holds another: the first to go."""

    def starting(self) -> tuple[str, ...]:
        # Until the watcher has put it in the gateway: the controller never sees it gone.
        ready = ReplicaState.READY
        return tuple(r for r in self._waits.ids() if self._watcher.states.get(r) is not ready)

    def remove_first(self) -> frozenset[str]:
        return frozenset(self._sharing)

    async def add(self) -> str:
        replicas = self._replicas
        target = None
        if replicas.plan.spread:
            free, holding = await asyncio.to_thread(_free_and_holding, replicas)
            target = node_for_added_replica(replicas.plan.replica_need, free, holding)
        replica = replicas.add(target)
        rid = replica.replica_id
        self._watcher.follow(replica)
        self._waits.start(rid, self._until_ready(replica))
        return rid

    async def _until_ready(self, replica: RayReplica) -> None:
        rid = replica.replica_id
        try:
            if replica.own_group:
                await self._placed(replica)
            startup_timeout_s = self._replicas.config.engine.startup_timeout_s
            await self._until_ready_in_gateway(rid, startup_timeout_s)
        except _NotStarted as exc:
            self._warn(f"autoscale: replica {rid} did not start: {exc}; it is removed")
            self._waits.discard(rid)
            await self._drop(rid)
        finally:
            self._waits.discard(rid)

    async def _placed(self, replica: RayReplica) -> None:
        """Wait for the replica's own group; under `spread`, say if it shares a node."""
        timeout_s = self._replicas.config.cluster.placement_timeout_s
        if not await wait_placed(self._replicas.group_of(replica), timeout_s):
            raise _NotStarted(f"its placement group was not placed within {timeout_s:g} s")
        if self._replicas.plan.spread and await asyncio.to_thread(self._shares_a_node, replica):
            self._sharing.add(replica.replica_id)
            self._warn(
                f"autoscale: replica {replica.replica_id} shares a node with another replica: "
                "no node without one had room; it is the first to go when the fleet shrinks"
            )

    async def _until_ready_in_gateway(self, rid: str, startup_timeout_s: float) -> None:
        deadline = time.monotonic() + startup_timeout_s + ACTOR_START_S
        while (state := self._watcher.states.get(rid)) is not ReplicaState.READY:
            if state is ReplicaState.FAILED:
                raise _NotStarted("its server did not start (its log says why)")
            if time.monotonic() > deadline:
                raise _NotStarted(f"not ready within {startup_timeout_s + ACTOR_START_S:g} s")
            await asyncio.sleep(_POLL_S)

    def _shares_a_node(self, replica: RayReplica) -> bool:
        group = self._replicas.group_of(replica)
        placed_on = set(group_state(group, replica.group_name).node_ids)
        return bool(placed_on & self._replicas.holding_nodes(leaving_out=replica.group_name))

    async def remove(self, replica_id: str) -> None:
        await self._waits.cancel(replica_id)
        await self._drop(replica_id)

    async def _drop(self, replica_id: str) -> None:
        self._sharing.discard(replica_id)
        await self._watcher.forget(replica_id)
        await self._replicas.remove(replica_id)

    async def close(self) -> None:
        await self._waits.cancel_all()


class _NotStarted(Exception):
    pass


def _free_and_holding(replicas: RayReplicas) -> tuple[list[NodeResources], set[str]]:
    return cluster.free_resources(), replicas.holding_nodes()
