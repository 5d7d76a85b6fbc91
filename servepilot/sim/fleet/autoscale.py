"""The simulated fleet's autoscaling hook: the snapshot a policy of `scaling/` sees, built
from the simulated gateway as the fleet's controller builds it from the real one, and the
log of what the policy changed. With an adaptive budget (autoscale.adaptive_budget), each tick
first sets every replica's concurrency budget as the controller does at the gateway."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.scaling.adaptive_budget import AdaptiveBudget, BudgetDecision
from servepilot.scaling.arrivals import ArrivalHistory
from servepilot.scaling.snapshot import AutoscalePolicy, FleetSnapshot, ReplicaSample, ScaleDecision
from servepilot.sim.fleet.gateway import SimGateway
from servepilot.sim.fleet.members import ReplicaState


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """A decision that changed the number of replicas."""

    at_s: float
    before: int
    decision: ScaleDecision


@dataclass(frozen=True, slots=True)
class BudgetEvent:
    """A tick that changed the replicas' adaptive budget."""

    at_s: float
    decision: BudgetDecision


class AutoscaleHook:
    """Counts the gateway's arrivals, and every tick asks the policy for a replica count
    (after setting the budgets, with an adaptive one)."""

    def __init__(self, policy: AutoscalePolicy, budget: AdaptiveBudget | None = None) -> None:
        self.policy = policy
        self.budget = budget
        self.arrivals = ArrivalHistory()
        self.events: list[ScaleEvent] = []
        self.budget_events: list[BudgetEvent] = []
        self.scraped_s = 0.0
        """When the gateway last read vLLM's gauges (the simulator scrapes every replica at
        once)."""

    def snapshot(self, gateway: SimGateway, now_s: float) -> FleetSnapshot:
        age_s = now_s - self.scraped_s
        samples = tuple(
            ReplicaSample(
                replica_id=r.replica_id,
                ready=r.state is ReplicaState.READY,
                in_flight=r.in_flight,
                running=r.running,
                waiting=r.waiting,
                kv_usage=r.kv_usage,
                metrics_age_s=age_s,
                budget=r.capacity,
            )
            for r in gateway.replicas.values()
            if r.state in (ReplicaState.READY, ReplicaState.STARTING)
        )
        return FleetSnapshot(
            now_s=now_s,
            replicas=samples,
            draining=len(gateway.replicas) - len(samples),
            queued_by_class=gateway.queue.depth_by_class(),
            arrivals_per_s=self.arrivals.per_second(now_s),
        )

    def decide(self, gateway: SimGateway, now_s: float) -> int:
        snapshot = self.snapshot(gateway, now_s)
        if self.budget is not None:
            self._adapt_budget(gateway, snapshot, now_s)
        decision = self.policy.decide(snapshot, now_s)
        desired = max(0, decision.replicas)
        if desired != snapshot.provisioned:
            self.events.append(ScaleEvent(now_s, snapshot.provisioned, decision))
        return desired

    def _adapt_budget(self, gateway: SimGateway, snapshot: FleetSnapshot, now_s: float) -> None:
        assert self.budget is not None
        chosen = self.budget.decide(snapshot)
        changed = False
        for replica in gateway.replicas.values():
            budget = chosen.applied(replica.hard_capacity)
            if budget != replica.capacity:
                gateway.set_budget(replica, budget)
                changed = True
        if changed:
            self.budget_events.append(BudgetEvent(now_s, chosen))
