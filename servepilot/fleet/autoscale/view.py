"""The gateway's live state as the `FleetSnapshot` a scaling policy reads: per replica the
gateway's in-flight count and budget and vLLM's scraped gauges with their age, the admission
queue by class, the replicas a backend is still starting, and the arrivals of each second;
and the warm pool as the gateway holds it (`PoolView`), with its sleep and wake."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from servepilot.gateway import Gateway, ReplicaInfo
from servepilot.gateway.replica import SleepState
from servepilot.scaling.adaptive_budget import BudgetDecision
from servepilot.scaling.arrivals import ArrivalHistory
from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample


def replica_sample(info: ReplicaInfo, now_s: float) -> ReplicaSample:
    """One replica the gateway routes to (or would, once healthy again). A replica that is
    down keeps the age of its last gauges: stale, it counts as full, never as idle."""
    scraped = info.scraped_at_s
    return ReplicaSample(
        replica_id=info.replica_id,
        ready=True,
        in_flight=info.in_flight,
        running=info.running,
        waiting=info.waiting,
        kv_usage=info.kv_cache_usage,
        metrics_age_s=math.inf if scraped is None else max(0.0, now_s - scraped),
        budget=info.capacity,
    )


def starting_sample(replica_id: str, budget: int) -> ReplicaSample:
    return ReplicaSample(replica_id, False, 0, 0, 0, 0.0, 0.0, budget)


def fleet_snapshot(
    infos: Iterable[ReplicaInfo],
    starting: Iterable[str],
    queued_by_class: tuple[int, int, int],
    arrivals_per_s: tuple[float, ...],
    now_s: float,
    default_budget: int,
    leave_out: Collection[str] = (),
) -> FleetSnapshot:
    """Draining replicas are counted apart; a starting one the gateway already lists (it
    joins while its backend still waits on it) is counted once. One waking is capacity on its
    way (counted as starting: no second replica is asked for meanwhile); those asleep, parked
    or falling asleep are none, nor are those in `leave_out` (the warm pool's refills)."""
    samples: list[ReplicaSample] = []
    draining = 0
    for info in infos:
        if info.replica_id in leave_out:
            continue
        if info.draining:
            draining += 1
        elif info.sleep is SleepState.AWAKE:
            samples.append(replica_sample(info, now_s))
        elif info.sleep is SleepState.WAKING:
            samples.append(starting_sample(info.replica_id, info.capacity))
    known = {s.replica_id for s in samples}
    samples += [starting_sample(r, default_budget) for r in starting
                if r not in known and r not in leave_out]  # fmt: skip
    return FleetSnapshot(now_s, tuple(samples), draining, queued_by_class, arrivals_per_s)


@dataclass(frozen=True, slots=True)
class PoolView:
    """The warm pool as the gateway holds it."""

    held: tuple[str, ...] = ()
    """Asleep or parked, ready to be woken, in the gateway's order (oldest first)."""
    falling_asleep: frozenset[str] = frozenset()
    """On their way into the pool (drained, then put to sleep or parked)."""
    waking: frozenset[str] = frozenset()
    serving: frozenset[str] = frozenset()
    """In rotation (a refill that joined is put to sleep once it serves)."""


def pool_view(infos: Iterable[ReplicaInfo]) -> PoolView:
    infos = [i for i in infos if not i.draining]
    return PoolView(
        tuple(i.replica_id for i in infos if i.sleep.held),
        frozenset(i.replica_id for i in infos if i.sleep is SleepState.FALLING_ASLEEP),
        frozenset(i.replica_id for i in infos if i.sleep is SleepState.WAKING),
        frozenset(i.replica_id for i in infos if i.serving),
    )


class GatewayView:
    """Reads one in-process gateway. `count_arrivals` (every second) turns the gateway's
    arrival counter into per-second counts; `snapshot` is what a tick hands the policy.
    `now_s` comes from the caller's clock, which must be time.monotonic's (the gateway
    stamps its scrapes with it)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self.arrivals = ArrivalHistory()
        self._counted = gateway.metrics.arrivals

    def count_arrivals(self, now_s: float) -> None:
        total = self._gateway.metrics.arrivals
        self.arrivals.add(now_s, total - self._counted)
        self._counted = total

    def snapshot(
        self, now_s: float, starting: Collection[str], leave_out: Collection[str] = ()
    ) -> FleetSnapshot:
        """`starting`: what the backend starts to serve; `leave_out`: the pool's refills."""
        gateway = self._gateway
        return fleet_snapshot(
            gateway.pool.replicas(),
            starting,
            gateway.dispatcher.queue.depth_by_class(),
            self.arrivals.per_second(now_s),
            now_s,
            gateway.config.admission.replica_concurrency,
            leave_out,
        )

    def pool(self) -> PoolView:
        return pool_view(self._gateway.pool.replicas())

    def apply_budget(self, decision: BudgetDecision) -> int:
        """Every replica the gateway holds gets the budget, within its own hard capacity;
        returns how many budgets changed."""
        pool, changed = self._gateway.pool, 0
        for info in pool.replicas():
            budget = decision.applied(info.ceiling)
            if budget != info.capacity:
                pool.set_budget(info.replica_id, budget)
                changed += 1
        return changed

    async def drain(self, replica_id: str, timeout_s: float) -> bool:
        """Stop routing to the replica, wait for its requests (up to `timeout_s`), drop it."""
        return await self._gateway.pool.remove(replica_id, timeout_s)

    async def sleep(self, replica_id: str, drain_timeout_s: float) -> None:
        """Out of rotation, its requests finished, asleep (level 1: weights kept in host
        memory) or parked."""
        await self._gateway.warm.sleep(replica_id, level=1, drain_timeout_s=drain_timeout_s)

    async def wake(self, replica_id: str) -> float:
        """Back in rotation; the seconds the replica took."""
        return (await self._gateway.warm.wake(replica_id)).took_s
