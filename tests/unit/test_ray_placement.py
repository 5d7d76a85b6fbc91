"""Placement planning for the Ray backend, and the feasibility check that names what a
cluster lacks: pure functions, known answers."""

from __future__ import annotations

import pytest

from servepilot.core.config import parse_config
from servepilot.fleet.ray.placement import (
    Bundle,
    NodeResources,
    ReplicaLayout,
    placement_shortfall,
    plan_placement,
    spread_selector,
)


def _layout(replicas: int = 4, tp: int = 1, pp: int = 1, per_node: int = 8) -> ReplicaLayout:
    return ReplicaLayout(replicas, tp, pp, per_node, cpus_per_replica=1.0, spread=True)


def _nodes(count: int, cpus: float, gpus: float) -> list[NodeResources]:
    return [NodeResources(f"n{i}", cpus, gpus) for i in range(count)]


def test_a_tp8_replica_packs_its_eight_gpus_on_one_node() -> None:
    plan = plan_placement(_layout(tp=8))
    assert plan.bundles == (Bundle(1.0, 0),) + (Bundle(0, 1),) * 8
    assert [b.resources() for b in plan.bundles[:2]] == [{"CPU": 1.0}, {"GPU": 1.0}]
    assert (plan.strategy, plan.ray_executor, plan.engine_args) == ("STRICT_PACK", False, ())
    assert plan.replica_need == Bundle(1.0, 8)
    assert plan.describe() == (
        "4 placement groups of [{CPU: 1}] + [{GPU: 1}] x 8 STRICT_PACK, at most one per node"
    )


def test_a_replica_wider_than_a_node_runs_vllms_ray_executor() -> None:
    plan = plan_placement(_layout(replicas=2, tp=8, pp=2, per_node=8))
    assert (plan.bundles, plan.strategy, plan.gpus_per_replica) == ((Bundle(1.0, 0),), "PACK", 16)
    assert plan.engine_args == ("--distributed-executor-backend", "ray")
    assert "vLLM's Ray executor places its GPUs" in plan.describe()
    short = placement_shortfall(plan, _nodes(3, 8, 8))
    assert short is not None
    assert short.startswith("2 replicas of 16 GPUs across nodes need 32 GPUs; the cluster has 24")
    assert placement_shortfall(plan, _nodes(4, 8, 8)) is None


def test_cpu_replicas_are_one_cpu_bundle_from_the_fleet_config() -> None:
    config = parse_config(
        {"replicas": {"count": 3}, "cluster": {"cpus_per_replica": 2, "placement": "pack"}},
        origin="test",
    )
    layout = ReplicaLayout.from_config(config)
    assert (layout.gpus_per_node, layout.gpus_per_replica, layout.spread) == (0, 0, False)
    plan = plan_placement(layout)
    assert plan.bundles == (Bundle(2.0, 0),)
    assert plan.bundles[0].resources() == {"CPU": 2.0}


def test_the_gpu_config_gives_tp_gpu_bundles() -> None:
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
    layout = ReplicaLayout(5, 2, 1, 8, cpus_per_replica=1.0, spread=False)
    plan = plan_placement(layout)
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


@pytest.mark.parametrize(
    ("avoid", "selector"),
    [([], {}), (["b", "a", "b"], {"ray.io/node-id": "!in(a,b)"})],
)
def test_spread_selector_keeps_bundles_off_the_nodes_taken(
    avoid: list[str], selector: dict[str, str]
) -> None:
    assert spread_selector(avoid) == selector
