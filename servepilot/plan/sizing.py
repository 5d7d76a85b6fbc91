"""How many replicas and nodes the target rate needs, from the plan's own capacity estimate.

Replicas needed = ceil(target QPS / one replica's requests/s at capacity); they are packed
onto nodes of `count` accelerators (several replicas per node when one replica takes fewer
accelerators than a node has, or when replicas share accelerators; several nodes per replica
when its layout spans nodes). The
advice and the cost both read this one sizing, so they agree with the estimate beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servepilot.plan.estimate import Estimates


@dataclass(frozen=True, slots=True)
class Sizing:
    target_qps: float
    replica_qps: float
    """One replica's requests/s at capacity (the estimate's)."""
    replicas: int
    """Replicas the target needs: ceil(target_qps / replica_qps)."""
    devices_per_replica: int
    """Accelerators of one replica's layout (TP x PP x DP), shared by replicas_per_device."""
    devices_per_node: int
    nodes: int
    """Nodes those replicas take, whole nodes."""
    replicas_per_device: int = 1

    @property
    def node_qps(self) -> float:
        """Requests/s one node carries at capacity (one replica's share when it spans nodes)."""
        shared = self.replica_qps * self.replicas_per_device
        return shared * self.devices_per_node / self.devices_per_replica

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


def size_fleet(
    found: Estimates,
    *,
    target_qps: float | None,
    devices_per_replica: int,
    devices_per_node: int,
    replicas_per_device: int = 1,
) -> Sizing | None:
    """None without a target rate. `replicas_per_device`: replicas sharing each group of
    `devices_per_replica` accelerators."""
    replicas = found.replicas_for_target
    if target_qps is None or replicas is None:
        return None
    groups = math.ceil(replicas / replicas_per_device)
    if devices_per_replica <= devices_per_node:
        nodes = math.ceil(groups / (devices_per_node // devices_per_replica))
    else:
        nodes = groups * math.ceil(devices_per_replica / devices_per_node)
    return Sizing(
        target_qps=target_qps,
        replica_qps=found.capacity.requests_per_s,
        replicas=replicas,
        devices_per_replica=devices_per_replica,
        devices_per_node=devices_per_node,
        nodes=nodes,
        replicas_per_device=replicas_per_device,
    )
