"""Replicas, nodes, cost and the one-node-or-many advice from the plan's own capacity estimate.

A cost model of fixed 10 ms steps makes the capacity known by hand: at capacity a replica
runs max_num_seqs = 256 requests of 256 output tokens, so one request finishes per step,
100 requests/s per replica. Prices are the shipped catalog's.
"""

from __future__ import annotations

import math

import pytest

from servepilot.core.config import TrafficConfig
from servepilot.plan.advice import Deployment
from servepilot.plan.costmodel import CostModel
from servepilot.plan.hardware import get_accelerator
from servepilot.plan.planner import Plan, make_plan
from tests.unit.test_plan import request

TEN_MS_STEPS = CostModel(0.01, 0.0, 0.0, 0.0, 0.0, 0.0, source="fixed: 10 ms steps")
REPLICA_QPS = 100.0
OUTPUT_TOKENS = 256


def sized(
    model: str, accelerator: str, qps: float, *, nodes: int = 1, bursty: bool = False
) -> Plan:
    traffic = TrafficConfig(target_qps=qps, output_tokens=OUTPUT_TOKENS, bursty=bursty)
    req = request(model, accelerator, count=8, nodes=nodes, traffic=traffic, max_num_seqs=256)
    return make_plan(req.replace(cost_model=TEN_MS_STEPS))


@pytest.mark.parametrize(
    ("qps", "replicas", "nodes", "deployment"),
    [
        # llama-3.1-8b runs TP1 on an H100: 8 replicas per node, 800 QPS per node.
        (100.0, 1, 1, Deployment.SINGLE_NODE),
        (400.0, 4, 1, Deployment.SINGLE_NODE),
        (800.0, 8, 1, Deployment.SINGLE_NODE),
        (801.0, 9, 2, Deployment.DISTRIBUTED),
        (2000.0, 20, 3, Deployment.DISTRIBUTED),
        (5000.0, 50, 7, Deployment.DISTRIBUTED),
    ],
)
def test_one_gpu_replicas_are_packed_eight_to_a_node(
    qps: float, replicas: int, nodes: int, deployment: Deployment
) -> None:
    plan = sized("llama-3.1-8b", "h100", qps)
    assert plan.option.parallelism.devices == 1
    assert plan.estimates is not None
    assert plan.estimates.capacity.requests_per_s == pytest.approx(REPLICA_QPS)
    assert plan.estimates.replicas_for_target == replicas
    price = get_accelerator("h100").price_usd_per_hour  # 6.155
    per_hour = nodes * 8 * price
    c = plan.cost
    assert c.nodes_for_target == nodes
    assert c.usd_per_hour == pytest.approx(8 * price)  # the hardware as planned: one node
    assert c.usd_per_hour_for_target == pytest.approx(per_hour)
    assert c.usd_per_qps == pytest.approx(per_hour / qps)
    assert c.usd_per_million_output_tokens == pytest.approx(
        per_hour / (qps * OUTPUT_TOKENS * 3600) * 1e6
    )
    assert c.over_qps_line is (per_hour / qps > 0.1)
    assert plan.advice.deployment is deployment


def test_known_answers_in_dollars() -> None:
    # 5,000 QPS: 50 replicas, 7 nodes x 8 x $6.155 = $344.68/hour, $0.068936 per QPS-hour;
    # 5,000 x 256 x 3,600 = 4,608 M tokens/hour: $0.0748 per 1M output tokens.
    c = sized("llama-3.1-8b", "h100", 5000.0).cost
    assert c.usd_per_hour_for_target == pytest.approx(344.68)
    assert c.usd_per_qps == pytest.approx(0.068936)
    assert c.usd_per_million_output_tokens == pytest.approx(344.68 / 4608)
    assert c.over_qps_line is False
    # 100 QPS: one node, $49.24/hour, $0.4924 per QPS-hour: over the $0.1 line.
    c = sized("llama-3.1-8b", "h100", 100.0).cost
    assert (c.usd_per_hour_for_target, c.usd_per_qps) == pytest.approx((49.24, 0.4924))
    assert c.over_qps_line is True


@pytest.mark.parametrize(("qps", "nodes"), [(100.0, 1), (400.0, 4), (5000.0, 50)])
def test_a_node_wide_replica_takes_a_node_each(qps: float, nodes: int) -> None:
    plan = sized("deepseek-v3", "h200", qps)
    assert plan.option.parallelism.describe() == "TP8+EP8"
    per_hour = nodes * 8 * 6.305
    assert plan.cost.nodes_for_target == nodes
    assert plan.cost.usd_per_qps == pytest.approx(per_hour / qps)
    expected = Deployment.SINGLE_NODE if nodes == 1 else Deployment.DISTRIBUTED
    assert plan.advice.deployment is expected
    if nodes > 1:
        assert plan.advice.reasons[0].startswith(f"{qps:,.0f} QPS needs {nodes} replica(s)")


def test_a_replica_over_two_nodes_takes_two_nodes_each() -> None:
    # DeepSeek-V3 at fp8 does not fit 8 x H100; over 2 nodes it runs TP8+PP2: 16 GPUs.
    plan = sized("deepseek-v3", "h100", 400.0, nodes=2)
    assert plan.option.parallelism.pp == 2
    assert plan.cost.nodes_for_target == 4 * 2
    assert plan.cost.usd_per_hour_for_target == pytest.approx(8 * 8 * 6.155)
    assert plan.advice.deployment is Deployment.DISTRIBUTED


def test_bursty_is_one_node_with_autoscaling_only_when_one_node_carries_the_rate() -> None:
    assert sized("llama-3.1-8b", "h100", 400.0, bursty=True).advice.deployment is (
        Deployment.SINGLE_NODE_AUTOSCALED
    )
    many = sized("llama-3.1-8b", "h100", 2000.0, bursty=True).advice
    assert many.deployment is Deployment.DISTRIBUTED
    assert any("autoscale" in reason for reason in many.reasons)


def test_over_the_distributed_line_stays_distributed_even_when_one_node_carries_it() -> None:
    # A replica of 1,000 requests/s: one node carries 8,000 QPS by the estimate.
    fast = CostModel(0.001, 0.0, 0.0, 0.0, 0.0, 0.0, source="fixed: 1 ms steps")
    traffic = TrafficConfig(target_qps=5000.0, output_tokens=OUTPUT_TOKENS)
    req = request("llama-3.1-8b", "h100", count=8, traffic=traffic, max_num_seqs=256)
    plan = make_plan(req.replace(cost_model=fast))
    assert plan.cost.nodes_for_target == math.ceil(5000 / 1000 / 8)
    assert plan.advice.deployment is Deployment.DISTRIBUTED


def test_without_a_target_only_the_hourly_price_is_known() -> None:
    plan = make_plan(request("llama-3.1-8b", "h100", count=8))
    c = plan.cost
    assert c.usd_per_hour == pytest.approx(8 * 6.155)
    assert (c.nodes_for_target, c.usd_per_qps, c.usd_per_million_output_tokens) == (
        None,
        None,
        None,
    )
    assert plan.advice.deployment is Deployment.SINGLE_NODE


def test_two_nodes_for_a_model_one_node_carries_are_warned_about() -> None:
    assert any("18%" in w for w in sized("llama-3.1-8b", "h100", 400.0, nodes=2).advice.warnings)
    # When the target itself needs more than a node, the second node is no mistake.
    assert not sized("llama-3.1-8b", "h100", 2000.0, nodes=2).advice.warnings
    assert not sized("llama-3.1-8b", "h100", 400.0, nodes=4).advice.warnings


def test_replicas_sharing_gpus_run_at_half_speed_and_pack_two_to_a_gpu() -> None:
    # Two replicas per H200 (each KV cache still holds max_num_seqs) take turns on it: 50
    # requests/s each at capacity, so 800 QPS needs 16 replicas, two to a GPU: the same 8
    # GPUs, one node, as unshared.
    traffic = TrafficConfig(target_qps=800.0, output_tokens=OUTPUT_TOKENS)
    req = request("llama-3.1-8b", "h200", count=8, traffic=traffic, max_num_seqs=256)
    plan = make_plan(req.replace(cost_model=TEN_MS_STEPS, replicas_per_gpu=2))
    assert plan.estimates is not None
    assert plan.estimates.capacity.requests_per_s == pytest.approx(REPLICA_QPS / 2)
    assert (plan.option.replicas, plan.estimates.replicas_for_target) == (16, 16)
    assert plan.cost.nodes_for_target == 1
    price = get_accelerator("h200").price_usd_per_hour
    assert plan.cost.usd_per_hour_for_target == pytest.approx(8 * price)
    assert "one node carries 800.0 QPS" in " ".join(plan.advice.reasons)
