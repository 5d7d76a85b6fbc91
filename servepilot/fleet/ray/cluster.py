"""The connection to the Ray cluster, and what `up` and `status` read of it: its nodes.

`address: local` starts a Ray cluster of this machine alone and stops it with the fleet;
any other address joins a running cluster and leaves it as it was found. A process that is
already connected (a test, a notebook) is used as it is and left connected.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import ray

from servepilot.core.config import ClusterConfig
from servepilot.core.errors import FleetError
from servepilot.fleet.ray.placement import NodeResources
from servepilot.fleet.ray.view import NodeRow

# The fleet passes only small records through Ray's object store.
_LOCAL_OBJECT_STORE_BYTES = 128 * 2**20


@dataclass(frozen=True, slots=True)
class RayConnection:
    started_cluster: bool
    """`address: local`: this process started the cluster, and stops it."""
    owned: bool
    """This process connected, and disconnects."""

    def close(self) -> None:
        if self.owned:
            ray.shutdown()


def connect(cluster: ClusterConfig) -> RayConnection:
    """Join (or, with `address: local`, start) the cluster `cluster` names."""
    if ray.is_initialized():
        return RayConnection(started_cluster=False, owned=False)
    local = cluster.address == "local"
    options: dict[str, object] = {
        "logging_level": logging.WARNING,
        # The replicas' output goes to their log files, not to `up`'s terminal.
        "log_to_driver": False,
    }
    if local:
        options |= {
            "address": "local",
            "num_cpus": cluster.local_cpus,
            "include_dashboard": False,
            "object_store_memory": _LOCAL_OBJECT_STORE_BYTES,
        }
    else:
        options["address"] = cluster.address
    try:
        with warnings.catch_warnings():
            # Ray's notice of a future default for CUDA_VISIBLE_DEVICES on GPU-less actors;
            # a replica's server gets its GPUs' ids set explicitly (actor.py).
            warnings.filterwarnings("ignore", "Tip: In future versions of Ray", FutureWarning)
            ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise FleetError(
            f"cannot join the Ray cluster at {cluster.address}: {exc}",
            hint="start one with `ray start --head`, give its address in cluster.address, "
            "or set cluster.address: local to start one on this machine",
        ) from None
    return RayConnection(started_cluster=local, owned=True)


def nodes() -> list[NodeRow]:
    """Every node the cluster knows, dead ones included (ray.nodes())."""
    rows = []
    for node in ray.nodes():
        total = node.get("Resources", {})
        address = f"{node.get('NodeManagerAddress')}:{node.get('NodeManagerPort')}"
        rows.append(NodeRow(str(node["NodeID"]), address, bool(node.get("Alive")),
                            float(total.get("CPU", 0)), float(total.get("GPU", 0))))  # fmt: skip
    return rows


def alive_resources() -> list[NodeResources]:
    """The alive nodes' resources, for the feasibility check."""
    return [NodeResources(n.node_id, n.cpus, n.gpus) for n in nodes() if n.alive]


def free_resources() -> list[NodeResources]:
    """What each alive node has free now (not held by a placement group, actor or task): where
    an added replica can go. Read as Ray Serve's scheduler reads it."""
    free = ray._private.state.available_resources_per_node()
    return [
        NodeResources(node_id, float(have.get("CPU", 0)), float(have.get("GPU", 0)))
        for node_id, have in sorted(free.items())
    ]
