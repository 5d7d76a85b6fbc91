"""One node or many (seed 000's decision tree), and what the deployment costs (seed 003)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from servepilot.core.config import TrafficConfig

# Seed 000's decision tree and its measured thresholds.
SINGLE_NODE_QPS = 1000.0
DISTRIBUTED_QPS = 3000.0
MIN_DISTRIBUTED_NODES = 4
"""Under 4 nodes a distributed deployment was 18% slower than one node (seed 000)."""
# Seed 003: cost per QPS above this triggers optimisation.
QPS_COST_LINE_USD = 0.1


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
    """All accelerators of the fleet at the catalog's (or your) price."""
    usd_per_qps: float | None
    """usd_per_hour / target_qps: the hourly cost of one request per second of the target."""
    usd_per_million_output_tokens: float | None
    """At the target QPS and mean output length, if the fleet sustains it."""
    over_qps_line: bool | None
    """usd_per_qps above seed 003's $0.1 line."""
    basis: str


def advise(traffic: TrafficConfig, *, nodes: int, nodes_needed: int) -> Advice:
    """`nodes_needed`: the fewest nodes one replica of the model fits on."""
    reasons: list[str] = []
    warnings: list[str] = []
    qps = traffic.target_qps
    if nodes_needed > 1:
        deployment = Deployment.DISTRIBUTED
        reasons.append(f"the model needs {nodes_needed} nodes for one replica")
    elif qps is not None and qps > DISTRIBUTED_QPS:
        deployment = Deployment.DISTRIBUTED
        reasons.append(
            f"{qps:,.0f} QPS sustained is over seed 000's {DISTRIBUTED_QPS:,.0f} QPS line: "
            f"distributed, with at least {MIN_DISTRIBUTED_NODES} nodes"
        )
    elif traffic.bursty:
        deployment = Deployment.SINGLE_NODE_AUTOSCALED
        reasons.append("bursty traffic: one node plus an autoscaling group for the peaks")
    elif qps is not None and qps < SINGLE_NODE_QPS:
        deployment = Deployment.SINGLE_NODE
        reasons.append(
            f"{qps:,.0f} QPS is under seed 000's {SINGLE_NODE_QPS:,.0f} QPS line: one node, "
            "tuned to the limit, costs least"
        )
    elif qps is not None:
        deployment = Deployment.SINGLE_NODE
        reasons.append(
            f"{qps:,.0f} QPS is between {SINGLE_NODE_QPS:,.0f} and {DISTRIBUTED_QPS:,.0f}: "
            "start with one node, measure it with `servepilot bench`, and go distributed "
            f"(at least {MIN_DISTRIBUTED_NODES} nodes) only if it falls short"
        )
    else:
        deployment = Deployment.SINGLE_NODE
        reasons.append(
            "no target QPS given (traffic.target_qps): one node first; measure its capacity "
            "with `servepilot bench`"
        )
    if 1 < nodes < MIN_DISTRIBUTED_NODES and nodes_needed == 1:
        warnings.append(
            f"{nodes} nodes for a model that fits on one: seed 000 measured distributed "
            f"deployments under {MIN_DISTRIBUTED_NODES} nodes 18% slower than a single node "
            "(cross-node hops cost 15-30 ms)"
        )
    return Advice(deployment=deployment, reasons=tuple(reasons), warnings=tuple(warnings))


def cost(traffic: TrafficConfig, *, price_usd_per_hour: float, accelerators: int) -> Cost:
    per_hour = price_usd_per_hour * accelerators
    qps = traffic.target_qps
    if qps is None:
        return Cost(
            usd_per_hour=per_hour,
            usd_per_qps=None,
            usd_per_million_output_tokens=None,
            over_qps_line=None,
            basis="no target QPS (traffic.target_qps): only the hourly price is known",
        )
    per_qps = per_hour / qps
    tokens_per_hour = qps * traffic.output_tokens * 3600
    return Cost(
        usd_per_hour=per_hour,
        usd_per_qps=per_qps,
        usd_per_million_output_tokens=per_hour / tokens_per_hour * 1e6,
        over_qps_line=per_qps > QPS_COST_LINE_USD,
        basis=(
            f"at the target {qps:,.0f} QPS x {traffic.output_tokens} output tokens, if the "
            "fleet sustains it; whether it does is measured by `servepilot bench`"
        ),
    )
