"""The replicas' placement groups on the cluster: placed within a deadline, read, removed.

Ray waits forever for a group it cannot place; here a group that is not placed within
cluster.placement_timeout_s fails `up` with what the cluster lacks (placement.py), measured on
the cluster's nodes at that moment, and every group already made is removed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray.util.placement_group import (
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from servepilot.core.errors import FleetError
from servepilot.fleet.ray.cluster import alive_resources
from servepilot.fleet.ray.placement import GroupSpec, PlacementPlan, placement_shortfall

_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class GroupState:
    name: str
    state: str
    """Ray's: PENDING, CREATED, RESCHEDULING (a node of it was lost), REMOVED."""
    node_ids: tuple[str, ...]
    """The nodes its bundles are on (empty while pending)."""


async def place_groups(plan: PlacementPlan, fleet_name: str, timeout_s: float) -> list[Any]:
    """The plan's groups (named `<fleet_name>-<key>`), placed; raises FleetError, having
    removed them all, if they are not placed within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    groups = [make_group(spec, fleet_name) for spec in plan.groups]
    try:
        for group in groups:
            if not await _placed_by(group, deadline):
                await _not_placed(plan, timeout_s)
    except BaseException:
        remove_groups(groups)
        raise
    return groups


def make_group(spec: GroupSpec, fleet_name: str, target_node: str | None = None) -> Any:
    """Ask Ray for one group, named `<fleet_name>-<key>`, without waiting for its placement.
    `target_node` (STRICT_PACK only) is a soft target, as Ray Serve aims its replicas' groups:
    Ray places the group there if the node has room, elsewhere if not, and ignores it when
    it reschedules the group after a node loss."""
    return placement_group(
        [bundle.resources() for bundle in spec.bundles],
        strategy=spec.strategy,
        name=group_name(fleet_name, spec.key),
        _soft_target_node_id=target_node,
    )


def group_name(fleet_name: str, key: str) -> str:
    return f"{fleet_name}-{key}"


async def wait_placed(group: Any, timeout_s: float) -> bool:
    """Whether Ray placed the group within `timeout_s` (it keeps trying after: remove it)."""
    return await _placed_by(group, time.monotonic() + timeout_s)


def group_state(group: Any, name: str) -> GroupState:
    table = placement_group_table(group)
    node_ids = tuple(dict.fromkeys(table.get("bundles_to_node_id", {}).values()))
    return GroupState(name, str(table.get("state", "UNKNOWN")), node_ids)


def remove_groups(groups: Sequence[Any]) -> None:
    for group in groups:
        with contextlib.suppress(Exception):  # already gone with a lost cluster
            remove_placement_group(group)


async def _placed_by(group: Any, deadline: float) -> bool:
    # Polled rather than group.wait(), which counts whole seconds only.
    while True:
        if (await asyncio.to_thread(placement_group_table, group)).get("state") == "CREATED":
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)


async def _not_placed(plan: PlacementPlan, timeout_s: float) -> None:
    shortfall = await asyncio.to_thread(_shortfall, plan)
    raise FleetError(
        f"the replicas' placement groups were not placed within {timeout_s:g} s: {shortfall}",
        hint="add nodes, lower replicas.count or engine.tensor_parallel_size, set "
        "cluster.placement: pack, or raise cluster.placement_timeout_s",
    )


def _shortfall(plan: PlacementPlan) -> str:
    said = placement_shortfall(plan, alive_resources())
    if said is not None:
        return said
    return (
        "the cluster's nodes could hold them, but not with what is free now (other placement "
        "groups, actors or tasks hold resources: `ray status` shows them)"
    )
