"""A local multi-node Ray cluster for the Ray backend's tests and bench_ray.py's recovery part
(ray.cluster_utils.Cluster: several raylets on this machine, logical GPUs), and fleet configs
of simulated replicas."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table

from servepilot.core.config import FleetConfig, parse_config

# Small: the tests pass only tiny records through the object store, on a 2-core machine.
OBJECT_STORE_BYTES = 100 * 2**20
WORKER_NODES = 3
GPUS_PER_NODE = 2


def start_cluster(worker_nodes: int = WORKER_NODES) -> Iterator[Cluster]:
    """A head (1 CPU, no GPU) and `worker_nodes` nodes of 2 CPUs and 2 logical GPUs; this
    process is its driver. Always shut down, whatever the tests did to it."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False,
                        "object_store_memory": OBJECT_STORE_BYTES},
    )  # fmt: skip
    try:
        for _ in range(worker_nodes):
            add_worker(cluster)
        with warnings.catch_warnings():
            # Ray's notice of a future default for GPU-less actors (as fleet/ray/cluster.py).
            warnings.filterwarnings("ignore", "Tip: In future versions of Ray", FutureWarning)
            ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def add_worker(cluster: Cluster) -> None:
    """One more node of 2 CPUs and GPUS_PER_NODE logical GPUs, once its raylet is up."""
    cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE, object_store_memory=OBJECT_STORE_BYTES)


def sim_fleet(**sections: dict[str, Any]) -> FleetConfig:
    """Simulated replicas on Ray (fixed 5 ms steps), with `sections` merged over that."""
    data: dict[str, dict[str, Any]] = {
        "engine": {"kind": "sim", "sim_step_ms": 5, "startup_timeout_s": 60},
        "cluster": {"backend": "ray", "placement_timeout_s": 30},
        "gateway": {"port": 0},
    }
    for name, section in sections.items():
        data[name] = {**data.get(name, {}), **section}
    return parse_config(data, origin="test")


def node_of(cluster: Cluster, node_id: str) -> Any:
    """The cluster_utils node object (what remove_node takes) of a Ray node id."""
    for node in cluster.list_all_nodes():
        if node.node_id == node_id:
            return node
    raise LookupError(node_id)


def our_actors_alive() -> list[str]:
    """Ids of the replica actors still alive (Ray's GCS table; no dashboard needed)."""
    actors = ray._private.state.actors()
    return [
        actor_id
        for actor_id, actor in actors.items()
        if actor.get("State") != "DEAD" and "ReplicaServer" in str(actor.get("ActorClassName"))
    ]


def our_groups_left() -> list[str]:
    """Names of the fleets' placement groups not removed (Ray's GCS table)."""
    return [
        g["name"] for g in placement_group_table().values()
        if g["name"].startswith("servepilot-") and g["state"] != "REMOVED"
    ]  # fmt: skip
