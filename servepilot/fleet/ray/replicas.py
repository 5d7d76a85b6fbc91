"""One `up`'s replicas on a Ray cluster: their placement groups and actors, from placement to
removal. `stop` leaves the cluster as it was found: no actor, no group of ours.

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
from servepilot.fleet.ray.groups import GroupState, group_state, place_groups, remove_groups
from servepilot.fleet.ray.placement import PlacementPlan, ReplicaLayout, plan_placement
from servepilot.fleet.ray.watcher import ReplicaUnavailable

# Beyond engine.startup_timeout_s (which the actor applies to its server): the actor's own
# start on a node (a worker process, the model resolved) may take this long too.
_ACTOR_START_S = 120.0
# After asking a replica to stop its server, how long to wait beyond its grace period.
_STOP_MARGIN_S = 10.0


@dataclass(frozen=True, slots=True)
class RayReplica:
    """One replica's actor and placement group; what the watcher follows it through."""

    replica_id: str
    actor: Any

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
    """Places the replicas' groups, starts their actors, waits for them, removes it all."""

    def __init__(self, config: FleetConfig, run_dir: Path, fleet_name: str) -> None:
        self.config = config
        self.run_dir = run_dir
        self.fleet_name = fleet_name
        self.plan: PlacementPlan = plan_placement(ReplicaLayout.from_config(config))
        self.replicas: list[RayReplica] = []
        self.groups: list[Any] = []
        self.answers: dict[str, ActorReady] = {}
        """The answer each replica gave when it first became ready."""

    @property
    def replica_ids(self) -> list[str]:
        return [f"r{index}" for index in range(self.config.replicas.count)]

    async def start(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        """Place the groups, start the actors, wait until every server is ready; on any
        failure (or cancellation) remove whatever was made."""
        try:
            await self._launch()
            return list(await asyncio.gather(*(self._ready(r, on_ready) for r in self.replicas)))
        except BaseException:
            await self.stop()
            raise

    async def _launch(self) -> None:
        timeout_s = self.config.cluster.placement_timeout_s
        self.groups = await place_groups(self.plan, self.fleet_name, timeout_s)
        actor_class = replica_actor_class()
        for replica_id, slot in zip(self.replica_ids, self.plan.slots, strict=True):
            spec = ActorSpec(
                self.config, replica_id, str(self.run_dir), self.plan.engine_args, slot.gpu_bundles
            )
            group = self.groups[slot.group]
            actor = actor_class.options(
                num_cpus=self.plan.replica_need.cpus,
                max_restarts=self.config.cluster.max_restarts,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=slot.bundle
                ),
            ).remote(spec)
            self.replicas.append(RayReplica(replica_id, actor))

    def group_states(self) -> list[GroupState]:
        names = [f"{self.fleet_name}-{spec.key}" for spec in self.plan.groups]
        return [group_state(g, name) for g, name in zip(self.groups, names, strict=True)]

    async def _ready(
        self, replica: RayReplica, on_ready: Callable[[ReplicaInfo], None]
    ) -> ReplicaInfo:
        timeout_s = self.config.engine.startup_timeout_s + _ACTOR_START_S
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

    async def stop(self) -> None:
        """Stop every server, kill every actor, remove every group."""
        grace_s = self.config.engine.stop_grace_s + _STOP_MARGIN_S

        async def stop_one(replica: RayReplica) -> None:
            with contextlib.suppress(Exception):  # a dead actor has no server left to stop
                await asyncio.wait_for(replica.actor.stop.remote(), grace_s)
            with contextlib.suppress(Exception):
                ray.kill(replica.actor, no_restart=True)

        await asyncio.gather(*(stop_one(r) for r in self.replicas))
        remove_groups(self.groups)
        self.replicas, self.groups = [], []


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
