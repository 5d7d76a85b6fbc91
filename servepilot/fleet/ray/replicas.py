"""One `up`'s replicas on a Ray cluster: their placement groups and actors, from placement to
removal, and one at a time for the autoscaler (`scaling.py`). `stop` leaves the cluster as it
was found: no actor, no group of ours.

The actors belong to the `up` process (not detached): if it dies, even by SIGKILL, Ray removes
its actors and groups with it, and their servers die with the actors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from servepilot.core.config import FleetConfig
from servepilot.core.errors import FleetError
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.ray.actor import ActorReady, ActorSpec, replica_actor_class
from servepilot.fleet.ray.groups import (
    GroupState,
    group_name,
    group_state,
    make_group,
    place_groups,
    remove_groups,
)
from servepilot.fleet.ray.placement import (
    PlacementPlan,
    ReplicaLayout,
    ReplicaSlot,
    own_group,
    own_slot,
    plan_placement,
)
from servepilot.fleet.ray.watcher import ReplicaUnavailable

# Beyond engine.startup_timeout_s (which the actor applies to its server): the actor's own
# start on a node (a worker process, the model resolved) may take this long too.
ACTOR_START_S = 120.0
# After asking a replica to stop its server, how long to wait beyond its grace period.
_STOP_MARGIN_S = 10.0


@dataclass(frozen=True, slots=True)
class RayReplica:
    """One replica's actor and where it sits; what the watcher follows it through."""

    replica_id: str
    actor: Any
    group_name: str
    """The placement group its actor is in."""
    own_group: bool
    """The group is the replica's alone (removed with it); else it is a bundle of the spread
    group, left reserved for the next replica added."""
    bundle: int

    async def ready(self) -> ActorReady:
        try:
            answer: ActorReady = await self.actor.ready.remote()
        except (RayActorError, RayTaskError) as exc:
            raise ReplicaUnavailable(_first_line(exc)) from None
        return answer

    async def until_exit(self) -> int:
        try:
            code: int = await self.actor.until_exit.remote()
        except (RayActorError, RayTaskError) as exc:
            raise ReplicaUnavailable(_first_line(exc)) from None
        return code

    def restart(self) -> None:
        """Have Ray start the actor afresh (it counts against cluster.max_restarts)."""
        with contextlib.suppress(Exception):  # already dead: Ray restarts it anyway
            ray.kill(self.actor, no_restart=False)


class RayReplicas:
    """Places the replicas' groups, starts their actors, waits for them, removes it all; the
    autoscaler adds and removes one at a time."""

    def __init__(self, config: FleetConfig, run_dir: Path, fleet_name: str) -> None:
        self.config = config
        self.run_dir = run_dir
        self.fleet_name = fleet_name
        self.plan: PlacementPlan = plan_placement(ReplicaLayout.from_config(config))
        self.replicas: list[RayReplica] = []
        self.answers: dict[str, ActorReady] = {}
        """The answer each replica gave when it first became ready."""
        self._groups: dict[str, Any] = {}
        """Every group of ours, by name."""
        self._aimed: dict[str, str] = {}
        """The node each added group was aimed at, by group name."""
        self._idle_bundles: list[int] = []
        """Bundles of the spread group whose replica was removed."""
        self._next_index = config.replicas.count
        """The index of the next added replica: an id (and its log file) is never given twice."""

    @property
    def replica_ids(self) -> list[str]:
        return [f"r{index}" for index in range(self.config.replicas.count)]

    async def start(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        """Place the groups, start the actors, wait until every server is ready; on any
        failure (or cancellation) remove whatever was made."""
        await self.launch()
        return await self.wait_ready(on_ready)

    async def launch(self) -> None:
        """Place the groups and start the actors; on any failure (or cancellation) remove
        whatever was made."""
        try:
            await self._launch()
        except BaseException:
            await self.stop()
            raise

    async def wait_ready(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        """Until every launched server is ready; on any failure (or cancellation) remove
        everything."""
        try:
            return list(await asyncio.gather(*(self._ready(r, on_ready) for r in self.replicas)))
        except BaseException:
            await self.stop()
            raise

    async def _launch(self) -> None:
        timeout_s = self.config.cluster.placement_timeout_s
        groups = await place_groups(self.plan, self.fleet_name, timeout_s)
        names = [group_name(self.fleet_name, spec.key) for spec in self.plan.groups]
        self._groups = dict(zip(names, groups, strict=True))
        for replica_id, slot in zip(self.replica_ids, self.plan.slots, strict=True):
            own = not self.plan.spread
            self.replicas.append(self._start_actor(replica_id, names[slot.group], own, slot))

    def _start_actor(
        self, replica_id: str, group_name: str, own_group: bool, slot: ReplicaSlot
    ) -> RayReplica:
        spec = ActorSpec(
            self.config, replica_id, str(self.run_dir), self.plan.engine_args, slot.gpu_bundles
        )
        actor = (
            replica_actor_class()
            .options(
                num_cpus=self.plan.replica_need.cpus,
                max_restarts=self.config.cluster.max_restarts,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._groups[group_name], placement_group_bundle_index=slot.bundle
                ),
            )
            .remote(spec)
        )
        return RayReplica(replica_id, actor, group_name, own_group, slot.bundle)

    def add(self, target_node: str | None) -> RayReplica:
        """One more replica (the autoscaler's), under a new id, started without waiting for
        its group's placement or its server: in a bundle of the spread group left by a removed
        replica if there is one (a node no other replica holds), else in a group of its own,
        aimed at `target_node`."""
        replica_id, self._next_index = f"r{self._next_index}", self._next_index + 1
        if self._idle_bundles:
            slot = self.plan.slots[self._idle_bundles.pop(0)]
            name = group_name(self.fleet_name, self.plan.groups[0].key)
            replica = self._start_actor(replica_id, name, False, slot)
        else:
            name = group_name(self.fleet_name, replica_id)
            spec = own_group(replica_id, self.plan.replica_need)
            self._groups[name] = make_group(spec, self.fleet_name, target_node)
            if target_node is not None:
                self._aimed[name] = target_node
            replica = self._start_actor(replica_id, name, True, own_slot(0, self.plan.replica_need))
        self.replicas.append(replica)
        return replica

    def group_of(self, replica: RayReplica) -> Any:
        return self._groups[replica.group_name]

    def holding_nodes(self, leaving_out: str = "") -> set[str]:
        """The nodes our groups are on (or, not placed yet, aimed at), but `leaving_out`'s
        (a group name). Blocking: it asks Ray's GCS."""
        held: set[str] = set()
        for name, group in list(self._groups.items()):
            if name != leaving_out:
                on = group_state(group, name).node_ids
                held |= set(on) if on else {self._aimed.get(name, "")} - {""}
        return held

    def group_states(self) -> list[GroupState]:
        return [group_state(group, name) for name, group in list(self._groups.items())]

    async def _ready(
        self, replica: RayReplica, on_ready: Callable[[ReplicaInfo], None]
    ) -> ReplicaInfo:
        timeout_s = self.config.engine.startup_timeout_s + ACTOR_START_S
        try:
            answer = await asyncio.wait_for(replica.ready(), timeout_s)
        except (ReplicaUnavailable, TimeoutError) as exc:
            raise FleetError(f"replica {replica.replica_id} did not start: {exc}") from None
        if answer.info is None:
            raise FleetError(
                f"replica {replica.replica_id} on node {answer.node_ip}: {answer.failure}"
            )
        self.answers[replica.replica_id] = answer
        on_ready(answer.info)
        return answer.info

    async def remove(self, replica_id: str) -> None:
        """Stop one replica's server, kill its actor, and remove its group (a bundle of the
        spread group stays, for the next replica added)."""
        replica = next((r for r in self.replicas if r.replica_id == replica_id), None)
        if replica is None:
            return
        self.replicas.remove(replica)
        self.answers.pop(replica_id, None)
        await self._stop_actor(replica)
        if replica.own_group:
            self._aimed.pop(replica.group_name, None)
            remove_groups([self._groups.pop(replica.group_name)])
        else:
            self._idle_bundles.append(replica.bundle)
            self._idle_bundles.sort()

    async def stop(self) -> None:
        """Stop every server, kill every actor, remove every group."""
        await asyncio.gather(*(self._stop_actor(r) for r in self.replicas))
        remove_groups(list(self._groups.values()))
        self.replicas, self._groups, self._aimed, self._idle_bundles = [], {}, {}, []

    async def _stop_actor(self, replica: RayReplica) -> None:
        grace_s = self.config.engine.stop_grace_s + _STOP_MARGIN_S
        with contextlib.suppress(Exception):  # a dead actor has no server left to stop
            await asyncio.wait_for(replica.actor.stop.remote(), grace_s)
        with contextlib.suppress(Exception):
            ray.kill(replica.actor, no_restart=True)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
