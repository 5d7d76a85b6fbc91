"""Several gateways in front of one fleet, as a load balancer spreads requests over gateway
pods: each pod routes with its own policy object, which sees only the requests it routes.

A policy that guesses what each replica caches from what it sent where (prefix affinity on
its prefix table) then knows only its pod's share: a session whose turns land on different
pods may be sent where its earlier turns are not. An exact index is built from the replicas'
own KV events, which every pod follows: the pods share it. The balancer spreads request by
request, round robin, as a Kubernetes Service in front of gateway pods does (by connection,
where clients keep theirs open; the benchmark's balancer spreads by request).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from servepilot.plan.step_latency import StepLatency
from servepilot.routing import make_policy
from servepilot.routing.base import ReplicaView, RequestView, RoutingPolicy
from servepilot.routing.kv_index import KvIndex
from servepilot.sim.fleet.records import FleetSpec


class GatewayPods:
    """One policy object per gateway pod, the requests dealt to them in turn."""

    def __init__(self, pods: Sequence[RoutingPolicy]) -> None:
        """`pods`: the same policy, one object per pod (`routing_policy` makes them)."""
        self._pods = tuple(pods)
        self._next = 0
        self.name = pods[0].name
        self.uses_prefix = pods[0].uses_prefix

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        pod = self._pods[self._next]
        self._next = (self._next + 1) % len(self._pods)
        return pod.choose(request, candidates)

    def forget(self, replica_id: str) -> None:
        for pod in self._pods:
            pod.forget(replica_id)

    def stats(self) -> Mapping[str, float]:
        """Every pod's counters, added up (what a dashboard sums over the pods)."""
        total: dict[str, float] = {}
        for pod in self._pods:
            for key, value in pod.stats().items():
                total[key] = total.get(key, 0.0) + value
        return total


def routing_policy(
    spec: FleetSpec, clock: Callable[[], float], kv_index: KvIndex | None
) -> RoutingPolicy:
    """The fleet's routing: `spec.gateway.policy`, or one per pod when `spec.gateways` > 1
    (each seeded apart, all reading the same exact index)."""
    gw = spec.gateway
    step_model = StepLatency(spec.cost, spec.scheduler.max_num_batched_tokens)
    pods = [make_policy(gw.policy, gw.routing, seed=spec.seed + pod, clock=clock,
                        step_model=lambda _: step_model, kv_index=kv_index)
            for pod in range(spec.gateways)]  # fmt: skip
    return pods[0] if len(pods) == 1 else GatewayPods(pods)
