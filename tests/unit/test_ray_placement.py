"""Placement planning for the Ray backend, and the feasibility check that names what a
cluster lacks: pure functions, known answers."""

from __future__ import annotations

import pytest

from servepilot.core.config import parse_config
from servepilot.core.errors import FleetError
from servepilot.fleet.ray.placement import (
    Bundle,
    GroupSpec,
    NodeResources,
    ReplicaLayout,
    ReplicaSlot,
    check_room,
    node_for_added_replica,
    own_group,
    own_slot,
    placement_shortfall,
    plan_placement,
)


def _layout(
    replicas: int = 4, tp: int = 1, pp: int = 1, per_node: int = 8, spread: bool = True
) -> ReplicaLayout:
    return ReplicaLayout(replicas, tp, pp, per_node, cpus_per_replica=1.0, spread=spread)


def _nodes(count: int, cpus: float, gpus: float) -> list[NodeResources]:
    return [NodeResources(f"n{i}", cpus, gpus) for i in range(count)]


def test_pack_gives_each_replica_a_strict_pack_group_of_one_gpu_bundles() -> None:
    plan = plan_placement(_layout(replicas=2, tp=8, spread=False))
    bundles = (Bundle(1.0, 0),) + (Bundle(0, 1),) * 8
    assert plan.groups == (
        GroupSpec("r0", bundles, "STRICT_PACK"),
        GroupSpec("r1", bundles, "STRICT_PACK"),
    )
    assert [b.resources() for b in bundles[:2]] == [{"CPU": 1.0}, {"GPU": 1.0}]
    # The actor in bundle 0, a GPU lease in each of bundles 1..8.
    assert plan.slots[1] == ReplicaSlot(1, 0, (1, 2, 3, 4, 5, 6, 7, 8))
    assert (plan.replica_need, plan.ray_executor, plan.engine_args) == (Bundle(1.0, 8), False, ())
    assert plan.describe() == (
        "2 placement groups of [{CPU: 1}] + [{GPU: 1}] x 8 STRICT_PACK, one per replica, "
        "sharing nodes where they fit"
    )


def test_spread_is_one_strict_spread_group_with_a_bundle_a_replica() -> None:
    plan = plan_placement(_layout(replicas=3, tp=2))
    assert plan.groups == (GroupSpec("spread", (Bundle(1.0, 2),) * 3, "STRICT_SPREAD"),)
    assert Bundle(1.0, 2).resources() == {"CPU": 1.0, "GPU": 2.0}
    # Replica 2's actor and both its GPU leases sit in bundle 2.
    assert plan.slots == (ReplicaSlot(0, 0, (0, 0)), ReplicaSlot(0, 1, (1, 1)),
                          ReplicaSlot(0, 2, (2, 2)))  # fmt: skip
    assert plan.describe() == (
        "one STRICT_SPREAD placement group, a bundle {CPU: 1, GPU: 2} per replica (3): "
        "at most one replica per node"
    )


def test_a_replica_wider_than_a_node_runs_vllms_ray_executor() -> None:
    plan = plan_placement(_layout(replicas=2, tp=8, pp=2, per_node=8))
    assert plan.groups == (GroupSpec("spread", (Bundle(1.0, 0),) * 2, "STRICT_SPREAD"),)
    assert (plan.gpus_per_replica, plan.slots[0].gpu_bundles) == (16, ())
    assert plan.engine_args == ("--distributed-executor-backend", "ray")
    assert plan.describe().endswith("; vLLM's Ray executor places their GPUs")
    short = placement_shortfall(plan, _nodes(3, 8, 8))
    assert short is not None
    assert short.startswith("2 replicas of 16 GPUs across nodes need 32 GPUs; the cluster has 24")
    assert placement_shortfall(plan, _nodes(4, 8, 8)) is None


def test_cpu_replicas_from_the_fleet_config() -> None:
    config = parse_config(
        {"replicas": {"count": 3}, "cluster": {"cpus_per_replica": 2, "placement": "pack"}},
        origin="test",
    )
    layout = ReplicaLayout.from_config(config)
    assert (layout.gpus_per_node, layout.gpus_per_replica, layout.spread) == (0, 0, False)
    plan = plan_placement(layout)
    assert [g.bundles for g in plan.groups] == [(Bundle(2.0, 0),)] * 3
    assert plan.groups[0].bundles[0].resources() == {"CPU": 2.0}


def test_the_gpu_config_gives_tp_gpus_a_replica() -> None:
    config = parse_config(
        {"hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8},
         "engine": {"tensor_parallel_size": 4}},
        origin="test",
    )  # fmt: skip
    plan = plan_placement(ReplicaLayout.from_config(config))
    assert (plan.replica_need, plan.spread) == (Bundle(1.0, 4), True)


def test_more_spread_replicas_than_nodes_names_what_is_missing() -> None:
    plan = plan_placement(_layout(replicas=4, tp=8))
    nodes = [*_nodes(3, 16, 8), NodeResources("head", 4, 0)]
    assert placement_shortfall(plan, nodes) == (
        "4 replicas STRICT_SPREAD need 4 nodes with 1 CPU and 8 GPUs free; the cluster has 3 "
        "(nodes: 3 x 16 CPUs and 8 GPUs, 1 x 4 CPUs)"
    )
    assert placement_shortfall(plan, [*nodes, NodeResources("n9", 2, 8)]) is None


def test_pack_counts_how_many_replicas_each_node_holds() -> None:
    plan = plan_placement(_layout(replicas=5, tp=2, spread=False))
    # 4 replicas of 2 GPUs fit a node of 8 GPUs (and 4 CPUs), 1 fits a node of 3 GPUs.
    assert placement_shortfall(plan, [NodeResources("a", 4, 8), NodeResources("b", 8, 3)]) is None
    assert placement_shortfall(plan, [NodeResources("a", 3, 8), NodeResources("b", 8, 1)]) == (
        "5 replicas of 1 CPU and 2 GPUs each (one node a replica) need room for 5; "
        "the cluster's nodes hold 3 (nodes: 1 x 3 CPUs and 8 GPUs, 1 x 8 CPUs and 1 GPU)"
    )


def test_no_node_alive_is_said() -> None:
    short = placement_shortfall(plan_placement(_layout(replicas=1)), [])
    assert short == (
        "1 replica STRICT_SPREAD needs 1 node with 1 CPU and 1 GPU free; the cluster has 0 "
        "(no node is alive)"
    )


def test_a_cluster_that_cannot_grow_fails_before_placing_another_only_warns() -> None:
    plan = plan_placement(_layout(replicas=2, per_node=0))  # CPU replicas, spread
    one_node = [NodeResources("local", 2, 0)]
    lacking = "2 replicas STRICT_SPREAD need 2 nodes with 1 CPU free; the cluster has 1"
    with pytest.raises(FleetError) as caught:
        check_room(plan, one_node, fixed_cluster=True)
    assert caught.value.message.startswith(
        f"the Ray cluster of this machine cannot hold the replicas: {lacking}"
    )
    assert "cluster.placement: pack" in str(caught.value.hint)
    warning = check_room(plan, one_node, fixed_cluster=False)
    assert warning is not None and warning.startswith(lacking)
    assert check_room(plan, one_node * 2, fixed_cluster=True) is None


# --- where the autoscaler's added replica goes ----------------------------------------------


def test_an_added_replica_gets_a_group_of_its_own_like_a_packed_one() -> None:
    spread = plan_placement(_layout(replicas=2, tp=2))
    assert own_group("r5", spread.replica_need) == GroupSpec(
        "r5", (Bundle(1.0, 0), Bundle(0, 1), Bundle(0, 1)), "STRICT_PACK"
    )
    assert own_slot(0, spread.replica_need) == ReplicaSlot(0, 0, (1, 2))
    packed = plan_placement(_layout(replicas=2, tp=2, spread=False))
    assert packed.groups[1] == own_group("r1", packed.replica_need)


def test_an_added_replica_is_aimed_at_the_roomiest_node_that_holds_no_replica() -> None:
    need = Bundle(1.0, 2)
    free = [
        NodeResources("n0", 4, 8),  # room for 4, but r0 is there
        NodeResources("n1", 2, 2),  # room for 1
        NodeResources("n2", 3, 4),  # room for 2
        NodeResources("n3", 8, 1),  # no GPUs to spare
        NodeResources("n4", 2, 4),  # room for 2, as n2: the lower id wins
    ]
    assert node_for_added_replica(need, free, holding={"n0"}) == "n2"
    assert node_for_added_replica(need, free, holding={"n0", "n2", "n4"}) == "n1"
    # Every node with room holds a replica: no target (Ray puts it where it finds room).
    assert node_for_added_replica(need, free, holding={"n0", "n1", "n2", "n4"}) is None
    assert node_for_added_replica(need, [], holding=set()) is None
    # CPU replicas: CPUs alone count.
    assert node_for_added_replica(Bundle(1.0, 0), free[2:4], holding={"n2"}) == "n3"
