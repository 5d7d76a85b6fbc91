"""One node or many, and what the deployment costs, both from the plan's own sizing.

The decision tree: a model wider than a node, or a target rate more nodes than one carry
(by the plan's capacity estimate), is distributed; so is a sustained rate over the 3,000 QPS
distributed line. Bursty traffic that one node carries is one node plus autoscaling;
otherwise one node, tuned to the limit, costs least.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from servepilot.core.config import TrafficConfig
from servepilot.plan.sizing import Sizing

SINGLE_NODE_QPS = 1000.0
DISTRIBUTED_QPS = 3000.0
MIN_DISTRIBUTED_NODES = 4
"""Under 4 nodes a distributed deployment of a model that fits one node was measured 18%
slower than one node (cross-node hops cost 15-30 ms)."""
QPS_COST_LINE_USD = 0.1
"""Cost per QPS-hour above which a deployment is worth optimising."""


class Deployment(enum.StrEnum):
    SINGLE_NODE = "single-node"
    SINGLE_NODE_AUTOSCALED = "single-node+autoscaling"
    DISTRIBUTED = "distributed"


@dataclass(frozen=True, slots=True)
class Advice:
    deployment: Deployment
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Cost:
    usd_per_hour: float
    """All accelerators of the hardware planned (nodes x count) at the catalog's (or your)
    price."""
    nodes_for_target: int | None
    """Nodes the target QPS needs by the capacity estimate; None without a target or an
    estimate."""
    usd_per_hour_for_target: float | None
    """Those nodes' accelerators at the same price."""
    usd_per_qps: float | None
    """usd_per_hour_for_target / target_qps: the hourly cost of one request per second."""
    usd_per_million_output_tokens: float | None
    """usd_per_hour_for_target over the output tokens the target rate makes in an hour."""
    over_qps_line: bool | None
    """usd_per_qps above the $0.1 per QPS cost line."""
    basis: str


def advise(
    traffic: TrafficConfig, *, nodes: int, nodes_per_replica: int, sizing: Sizing | None
) -> Advice:
    """`nodes_per_replica`: the fewest nodes one replica of the model fits on; `sizing`: what
    the target rate needs (None without a target or an estimate)."""
    qps = traffic.target_qps
    warnings: list[str] = []
    if nodes_per_replica > 1:
        deployment = Deployment.DISTRIBUTED
        reasons = [f"the model needs {nodes_per_replica} nodes for one replica"]
    elif sizing is not None and sizing.nodes > 1:
        deployment = Deployment.DISTRIBUTED
        reasons = [_sized_reason(sizing)]
        if traffic.bursty:
            reasons.append(
                "bursty traffic: autoscale the node count above that floor for the peaks"
            )
    elif qps is not None and qps > DISTRIBUTED_QPS:
        deployment = Deployment.DISTRIBUTED
        reasons = [
            f"{qps:,.0f} QPS sustained is over the {DISTRIBUTED_QPS:,.0f} QPS distributed "
            f"line: distributed, with at least {MIN_DISTRIBUTED_NODES} nodes, although the "
            "estimate has one node carrying it at capacity"
        ]
    elif traffic.bursty:
        deployment = Deployment.SINGLE_NODE_AUTOSCALED
        reasons = ["bursty traffic: one node plus an autoscaling group for the peaks"]
    else:
        deployment = Deployment.SINGLE_NODE
        reasons = [_single_node_reason(qps, sizing)]
    one_node_carries = sizing is None or sizing.nodes == 1
    if 1 < nodes < MIN_DISTRIBUTED_NODES and nodes_per_replica == 1 and one_node_carries:
        warnings.append(
            f"{nodes} nodes for a model that fits on one: distributed deployments under "
            f"{MIN_DISTRIBUTED_NODES} nodes were measured 18% slower than a single node "
            "(cross-node hops cost 15-30 ms)"
        )
    return Advice(deployment=deployment, reasons=tuple(reasons), warnings=tuple(warnings))


def _sized_reason(sizing: Sizing) -> str:
    return (
        f"{sizing.target_qps:,.0f} QPS needs {sizing.replicas} replica(s) at the estimated "
        f"{sizing.replica_qps:,.2f} requests/s each, {sizing.nodes} nodes of "
        f"{sizing.devices_per_node} (one node carries {sizing.node_qps:,.1f} QPS)"
    )


def _single_node_reason(qps: float | None, sizing: Sizing | None) -> str:
    if qps is None:
        return (
            "no target QPS given (traffic.target_qps): one node first; measure its capacity "
            "with `servepilot bench`"
        )
    carried = "" if sizing is None else f" (one node carries {sizing.node_qps:,.1f} QPS)"
    if qps < SINGLE_NODE_QPS:
        return (
            f"{qps:,.0f} QPS{carried} is under the {SINGLE_NODE_QPS:,.0f} QPS single-node "
            "line: one node, tuned to the limit, costs least"
        )
    return (
        f"{qps:,.0f} QPS{carried} is between the {SINGLE_NODE_QPS:,.0f} QPS single-node line "
        f"and the {DISTRIBUTED_QPS:,.0f} QPS distributed line: start with one node, measure "
        "it with `servepilot bench`, and go distributed "
        f"(at least {MIN_DISTRIBUTED_NODES} nodes) only if it falls short"
    )


def cost(
    traffic: TrafficConfig, *, price_usd_per_hour: float, accelerators: int, sizing: Sizing | None
) -> Cost:
    """`accelerators`: all of the planned hardware; `sizing`: what the target rate needs."""
    per_hour = price_usd_per_hour * accelerators
    qps = traffic.target_qps
    if qps is None or sizing is None:
        why = (
            "no target QPS (traffic.target_qps)"
            if qps is None
            else "no capacity estimate (nothing fits)"
        )
        return Cost(
            usd_per_hour=per_hour,
            nodes_for_target=None,
            usd_per_hour_for_target=None,
            usd_per_qps=None,
            usd_per_million_output_tokens=None,
            over_qps_line=None,
            basis=f"{why}: only the hourly price of the planned hardware is known",
        )
    target_per_hour = price_usd_per_hour * sizing.devices
    per_qps = target_per_hour / qps
    tokens_per_hour = qps * traffic.output_tokens * 3600
    return Cost(
        usd_per_hour=per_hour,
        nodes_for_target=sizing.nodes,
        usd_per_hour_for_target=target_per_hour,
        usd_per_qps=per_qps,
        usd_per_million_output_tokens=target_per_hour / tokens_per_hour * 1e6,
        over_qps_line=per_qps > QPS_COST_LINE_USD,
        basis=(
            f"{sizing.replicas} replica(s) at the estimated {sizing.replica_qps:,.2f} "
            f"requests/s each, {traffic.output_tokens} output tokens per request, "
            f"${price_usd_per_hour:,.3f}/hour per accelerator; `servepilot bench` measures "
            "the capacity"
        ),
    )
