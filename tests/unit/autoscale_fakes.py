"""The autoscaler controller's seams, faked for its tests: an injected clock, a gateway view with
ready replicas and a journal, a backend that starts and stops replicas by name, a policy
that answers what the test says, and `rig` to put them together."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.autoscale.controller import AutoscaleController
from servepilot.fleet.backend import Replica, ReplicaEvent, ReplicaState
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
    """The gateway: ready replicas with an in-flight count each (budget 4), and a journal."""

    def __init__(self, backend: FakeBackend, in_flight: dict[str, int]) -> None:
        self.backend = backend
        self.in_flight = dict(in_flight)
        self.journal = backend.journal
        self.drain_gate: asyncio.Event | None = None

    def count_arrivals(self, now_s: float) -> None:
        self.journal.append("count arrivals")

    def snapshot(self, now_s: float) -> FleetSnapshot:
        ready = [ReplicaSample(r, True, n, n, 0, 0.0, 1.0, 4) for r, n in self.in_flight.items()]
        starting = [ReplicaSample(r, False, 0, 0, 0, 0.0, 0.0, 4) for r in self.backend.pending]
        return FleetSnapshot(now_s, tuple(ready + starting))

    async def drain(self, replica_id: str, timeout_s: float) -> bool:
        self.journal.append(f"drain {replica_id} within {timeout_s:g} s")
        try:
            if self.drain_gate is not None:
                await self.drain_gate.wait()
        except asyncio.CancelledError:
            self.journal.append(f"drain {replica_id} cancelled")
            raise
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

    @property
    def sleep_mode(self) -> bool:
        return False

    def list(self) -> tuple[Replica, ...]:
        starting = tuple(Replica(r, "", ReplicaState.STARTING) for r in self.pending)
        first = tuple(Replica(r, "http://x", ReplicaState.READY, remove_first=True)
                      for r in sorted(self.first))  # fmt: skip
        return starting + first

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
        if replica_id in self.pending:
            self.pending.remove(replica_id)
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
    policy: AutoscalePolicy, in_flight: dict[str, int]
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
        clock=clock,
    )
    return controller, fleet, backend, clock
