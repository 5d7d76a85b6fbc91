"""The simulated fleet's replicas over a level: launched, stopped, and with a warm pool
(`FleetSpec.warm_pool`), put to sleep and woken (vLLM's sleep mode: the process and its
compiled graphs kept, the GPU memory freed), as the fleet's controller does, through the same
`scaling.warm_pool.plan_pool`.

A replica's life: cold start (`cold_start_s`) -> serving -> drained -> stopped, or drained ->
falling asleep (`sleep_s`, still holding the GPU) -> asleep (host memory only) -> waking
(`wake_s`, capacity on its way, not routable) -> serving. A refill starts cold and falls
asleep once up, off the gateway. Its time is counted awake (GPU held: from launch to stop,
less the time asleep) and asleep, apart: a sleeping replica holds host memory, not a GPU.
"""

from __future__ import annotations

import random

from servepilot.scaling.warm_pool import PoolCounts, PoolPlan, plan_pool
from servepilot.sim.engine.replica import ReplicaModel
from servepilot.sim.fleet.gateway import SimGateway
from servepilot.sim.fleet.members import FleetReplica, Push, ReplicaState
from servepilot.sim.fleet.network import HopSampler
from servepilot.sim.fleet.records import FleetSpec, FleetStats


class FleetReplicas:
    """Every replica of a level, and the warm pool behind the serving ones."""

    def __init__(self, gateway: SimGateway, spec: FleetSpec, hop_rng: random.Random, push: Push,
                 ready_kind: int, pooled_kind: int) -> None:  # fmt: skip
        self.spec = spec
        self.gateway = gateway
        self._hop_rng = hop_rng
        self._push = push
        self._ready_kind = ready_kind
        self._pooled_kind = pooled_kind
        self.all: list[FleetReplica] = []
        """Every replica ever launched, in launch order."""
        self.asleep: list[FleetReplica] = []
        self.heading: list[FleetReplica] = []
        """On their way to the pool: refills starting cold, replicas draining or falling
        asleep."""
        self.peak = 0
        self.wakes = 0

    @property
    def active(self) -> int:
        """Serving or on their way to serve (ready, starting cold, waking)."""
        return self.gateway.ready + self.gateway.starting

    def launch(self, *, ready: bool, now_s: float, to_pool: bool = False) -> FleetReplica:
        """Start one more replica; a cold one serves after `cold_start_s` (a refill, `to_pool`,
        falls asleep then instead, off the gateway)."""
        spec = self.spec
        index = len(self.all)
        hop = HopSampler(spec.network.replica_delay(index), self._hop_rng)
        model = ReplicaModel(spec.scheduler, spec.cost)
        replica = FleetReplica(index, model, spec.capacity, hop, ready=ready, launched_s=now_s)
        replica.up_s = now_s if ready else now_s + spec.cold_start_s
        self.all.append(replica)
        if to_pool:
            replica.state = ReplicaState.DRAINING
            self.heading.append(replica)
            if not ready:
                self._push(replica.up_s + spec.sleep_s, self._pooled_kind, replica)
            return replica
        self.gateway.add(replica)
        if not ready:
            self._push(replica.up_s, self._ready_kind, (replica, replica.up_s))
        self.peak = max(self.peak, self.active)
        return replica

    def launch_asleep(self, now_s: float) -> None:
        """One more replica already in the pool (what `up` leaves asleep at the start)."""
        replica = self.launch(ready=True, now_s=now_s, to_pool=True)
        self.pooled(replica, now_s)

    def ready(self, event: tuple[FleetReplica, float]) -> None:
        """Its engine is up (the gateway's next health check finds it); an event of an
        earlier start or wake of the same replica is stale."""
        replica, up_s = event
        if replica.up_s == up_s and replica.state is ReplicaState.STARTING:
            replica.engine_ready = True

    def scale(self, desired: int, now_s: float) -> PoolPlan:
        counts = PoolCounts(self.active, len(self.asleep), len(self.heading))
        plan = plan_pool(counts, desired, self.spec.warm_pool, cold_refill=self.spec.cold_refill)
        for _ in range(plan.wake):
            self._wake(self.asleep.pop(), now_s)
        for _ in range(plan.start):
            self.launch(ready=False, now_s=now_s)
        if plan.sleep or plan.stop:
            # Newest first: the ones still starting, then the most recently ready.
            live = [r for r in self.all if r.state in (ReplicaState.STARTING, ReplicaState.READY)]
            live.sort(key=lambda r: (r.state is ReplicaState.STARTING, r.index), reverse=True)
            for n, replica in enumerate(live[: plan.sleep + plan.stop]):
                if n < plan.sleep:
                    self.heading.append(replica)
                self.gateway.drain(replica)
                self.retire_if_done(replica, now_s)
        for _ in range(plan.refill):
            self.launch(ready=False, now_s=now_s, to_pool=True)
        for _ in range(plan.drop_asleep):
            replica = self.asleep.pop(0)
            self._end_sleep(replica, now_s)
            replica.state = ReplicaState.STOPPED
            replica.stopped_s = now_s
        return plan

    def retire_if_done(self, replica: FleetReplica, now_s: float) -> None:
        """A draining replica with nothing left leaves the gateway: stopped, or falling
        asleep once its engine is up."""
        if replica.in_flight or replica.result is not None:
            return
        self.gateway.remove(replica)
        if replica in self.heading:
            self._push(max(now_s, replica.up_s) + self.spec.sleep_s, self._pooled_kind, replica)
        else:
            replica.stopped_s = now_s

    def pooled(self, replica: FleetReplica, now_s: float) -> None:
        """Asleep: in the pool, holding host memory only."""
        self.heading.remove(replica)
        replica.state = ReplicaState.ASLEEP
        replica.asleep_since_s = now_s
        self.asleep.append(replica)

    def _wake(self, replica: FleetReplica, now_s: float) -> None:
        self._end_sleep(replica, now_s)
        self.wakes += 1
        replica.state = ReplicaState.STARTING
        replica.engine_ready = False
        replica.up_s = now_s + self.spec.wake_s
        self.gateway.add(replica)
        self._push(replica.up_s, self._ready_kind, (replica, replica.up_s))
        self.peak = max(self.peak, self.active)

    @staticmethod
    def _end_sleep(replica: FleetReplica, now_s: float) -> None:
        if replica.asleep_since_s is not None:
            replica.asleep_total_s += now_s - replica.asleep_since_s
            replica.asleep_since_s = None

    def seconds(self, until_s: float) -> tuple[float, float]:
        """(awake, asleep) replica time from the start to `until_s`: awake from each launch (a
        cold start is paid for too) to its stop, less its time asleep."""
        awake = asleep = 0.0
        for replica in self.all:
            end_s = replica.stopped_s if replica.stopped_s is not None else until_s
            held = max(0.0, min(end_s, until_s) - replica.launched_s)
            slept = replica.asleep_total_s
            if replica.asleep_since_s is not None:
                slept += max(0.0, until_s - replica.asleep_since_s)
            awake += held - slept
            asleep += slept
        return awake, asleep

    def stats(
        self,
        now_s: float,
        events: int,
        cost: tuple[float, float],
        scale_events: int | None,
        kv_exact: bool,
    ) -> FleetStats:
        """What a level's run cost the fleet; `cost`: the run's wall and CPU seconds."""
        models = [r.model for r in self.all]
        queries = sum(m.prefix_cache_queries for m in models)
        hits = sum(m.prefix_cache_hits for m in models)
        awake_s, asleep_s = self.seconds(now_s)
        dispatched = sum(r.dispatched for r in self.all)
        gateway = self.gateway
        return FleetStats(
            sim_s=now_s, steps=sum(m.steps for m in models),
            preemptions=sum(m.num_preemptions for m in models),
            prefix_hit_rate=hits / queries if queries else 0.0, replicas_peak=self.peak,
            replicas_end=gateway.ready + gateway.starting,
            shed=dict(gateway.shed), queued=gateway.queued, events=events,
            wall_s=cost[0], cpu_s=cost[1],
            replica_s=awake_s, replica_asleep_s=asleep_s, wakes=self.wakes,
            scale_events=scale_events,
            cached_tokens_per_request=hits / dispatched if dispatched else 0.0,
            kv_exact=kv_exact,
        )  # fmt: skip
