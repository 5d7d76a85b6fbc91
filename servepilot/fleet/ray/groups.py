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
from servepilot.fleet.ray.placement import PlacementPlan, placement_shortfall

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
    groups = [
        placement_group(
            [bundle.resources() for bundle in spec.bundles],
            strategy=spec.strategy,
            name=f"{fleet_name}-{spec.key}",
        )
        for spec in plan.groups
    ]
    try:
        for group in groups:
            await _wait_placed(group, deadline, plan, timeout_s)
    except BaseException:
        remove_groups(groups)
        raise
    return groups


def group_state(group: Any, name: str) -> GroupState:
    table = placement_group_table(group)
    node_ids = tuple(dict.fromkeys(table.get("bundles_to_node_id", {}).values()))
    return GroupState(name, str(table.get("state", "UNKNOWN")), node_ids)


def remove_groups(groups: Sequence[Any]) -> None:
    for group in groups:
        with contextlib.suppress(Exception):  # already gone with a lost cluster
            remove_placement_group(group)


async def _wait_placed(group: Any, deadline: float, plan: PlacementPlan, timeout_s: float) -> None:
    # Polled rather than group.wait(), which counts whole seconds only.
    while time.monotonic() < deadline:
        if (await asyncio.to_thread(placement_group_table, group)).get("state") == "CREATED":
            return
        await asyncio.sleep(_POLL_S)
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
