"""The simulated fleet's autoscaling hook: the snapshot a policy of `scaling/` sees, built
from the simulated gateway as the fleet's controller builds it from the real one, and the
log of what the policy changed."""

from __future__ import annotations

from dataclasses import dataclass

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


class AutoscaleHook:
    """Counts the gateway's arrivals, and every tick asks the policy for a replica count."""

    def __init__(self, policy: AutoscalePolicy) -> None:
        self.policy = policy
        self.arrivals = ArrivalHistory()
        self.events: list[ScaleEvent] = []
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
        decision = self.policy.decide(snapshot, now_s)
        desired = max(0, decision.replicas)
        if desired != snapshot.provisioned:
            self.events.append(ScaleEvent(now_s, snapshot.provisioned, decision))
        return desired
