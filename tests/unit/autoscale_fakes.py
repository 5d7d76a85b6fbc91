"""The autoscaler controller's seams, faked for its tests: an injected clock, a gateway view with
ready replicas, a warm pool and a journal, a backend that starts and stops replicas by name, a
policy that answers what the test says, and `rig` to put them together."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection

from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.autoscale.controller import AutoscaleController
from servepilot.fleet.autoscale.view import PoolView
from servepilot.fleet.backend import Replica, ReplicaEvent, ReplicaState
from servepilot.scaling.adaptive_budget import AdaptiveBudget, BudgetDecision
from servepilot.scaling.snapshot import (
    AutoscalePolicy,
    FleetSnapshot,
    ReplicaSample,
    ScaleDecision,
    ScaleReason,
)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class FakeFleet:
    """The gateway: ready replicas with an in-flight count each (budget 4), replicas held in
    its warm pool, and a journal. A sleep or wake is instant (parking), or waits for
    `wake_gate` while the replica says it is waking."""

    def __init__(self, backend: FakeBackend, in_flight: dict[str, int]) -> None:
        self.backend = backend
        self.in_flight = dict(in_flight)
        self.held: list[str] = []
        self.waking: set[str] = set()
        self.journal = backend.journal
        self.drain_gate: asyncio.Event | None = None
        self.wake_gate: asyncio.Event | None = None
        self.arrivals_per_s: tuple[float, ...] = ()
        self.budgets: list[int] = []
        """The adaptive budgets applied, one per tick."""

    def count_arrivals(self, now_s: float) -> None:
        self.journal.append("count arrivals")

    def snapshot(
        self, now_s: float, starting: Collection[str], leave_out: Collection[str] = ()
    ) -> FleetSnapshot:
        ready = [ReplicaSample(r, True, n, n, 0, 0.0, 1.0, 4) for r, n in self.in_flight.items()
                 if r not in leave_out]  # fmt: skip
        on_way = [*sorted(self.waking), *starting]
        starting_ = [ReplicaSample(r, False, 0, 0, 0, 0.0, 0.0, 4) for r in on_way]
        return FleetSnapshot(now_s, tuple(ready + starting_), arrivals_per_s=self.arrivals_per_s)

    def apply_budget(self, decision: BudgetDecision) -> int:
        self.budgets.append(decision.applied(4))
        return 1

    def pool(self) -> PoolView:
        return PoolView(tuple(self.held), frozenset(), frozenset(self.waking),
                        frozenset(self.in_flight))  # fmt: skip

    async def sleep(self, replica_id: str, drain_timeout_s: float) -> None:
        self.journal.append(f"sleep {replica_id}")
        del self.in_flight[replica_id]
        self.held.append(replica_id)

    async def wake(self, replica_id: str) -> float:
        self.journal.append(f"wake {replica_id}")
        self.held.remove(replica_id)
        self.waking.add(replica_id)
        if self.wake_gate is not None:
            await self.wake_gate.wait()
        self.waking.discard(replica_id)
        self.in_flight[replica_id] = 0
        return 0.0

    def joined(self, replica_id: str) -> None:
        """A replica the backend started now serves."""
        self.backend.pending.remove(replica_id)
        self.backend.ready.add(replica_id)
        self.in_flight[replica_id] = 0

    async def drain(self, replica_id: str, timeout_s: float) -> bool:
        self.journal.append(f"drain {replica_id} within {timeout_s:g} s")
        try:
            if self.drain_gate is not None:
                await self.drain_gate.wait()
        except asyncio.CancelledError:
            self.journal.append(f"drain {replica_id} cancelled")
            raise
        if replica_id in self.held:  # dropped from the pool, which is above its target
            self.held.remove(replica_id)
        else:
            del self.in_flight[replica_id]
        return True


class FakeBackend:
    """A `ReplicaBackend` that starts and stops replicas by name, journaling each call; its
    replicas start and never get ready (the fake fleet says which are ready)."""

    def __init__(self) -> None:
        self.journal: list[str] = []
        self.pending: list[str] = []
        self.next_id = 1
        self.fail_adds = 0
        self.first: frozenset[str] = frozenset()
        self.ready: set[str] = set()
        self.failed: list[str] = []

    @property
    def sleep_mode(self) -> bool:
        return False

    def list(self) -> tuple[Replica, ...]:
        starting = tuple(Replica(r, "", ReplicaState.STARTING) for r in self.pending)
        first = tuple(Replica(r, "http://x", ReplicaState.READY, remove_first=r in self.first)
                      for r in sorted(self.first | self.ready))  # fmt: skip
        failed = tuple(Replica(r, "", ReplicaState.FAILED) for r in self.failed)
        return starting + first + failed

    def fail(self, replica_id: str) -> None:
        """A replica still starting did not start."""
        self.pending.remove(replica_id)
        self.failed.append(replica_id)

    async def start(self, count: int = 1) -> tuple[str, ...]:
        if self.fail_adds:
            self.fail_adds -= 1
            raise OSError("no free port")
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.pending.append(rid)
        self.journal.append(f"add {rid}")
        return (rid,)

    async def wait_started(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        return []

    async def stop(self, replica_id: str) -> None:
        for kept in (self.pending, self.failed):
            if replica_id in kept:
                kept.remove(replica_id)
        self.ready.discard(replica_id)
        self.journal.append(f"remove {replica_id}")

    async def stop_all(self) -> None:
        self.journal.append("stop all")

    async def watch(self) -> AsyncIterator[ReplicaEvent]:
        await asyncio.Event().wait()  # the fake fleet says who is ready
        yield  # type: ignore[misc]

    async def close(self) -> None:
        self.journal.append("close")


class Scripted:
    """A policy that answers what the test says."""

    name = "scripted"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        return ScaleDecision(self.replicas, ScaleReason.HOLD, "told so")


def rig(
    policy: AutoscalePolicy,
    in_flight: dict[str, int],
    pool_target: int = 0,
    budget: AdaptiveBudget | None = None,
) -> tuple[AutoscaleController, FakeFleet, FakeBackend, Clock]:
    backend = FakeBackend()
    fleet = FakeFleet(backend, in_flight)
    clock = Clock()
    controller = AutoscaleController(
        policy,
        backend,
        fleet,
        interval_s=5.0,
        drain_timeout_s=7.0,
        startup_timeout_s=60.0,
        pool_target=pool_target,
        budget=budget,
        clock=clock,
    )
    return controller, fleet, backend, clock
