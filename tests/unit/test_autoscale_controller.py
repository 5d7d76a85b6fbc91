"""The autoscaler controller behind its one seam (a fake backend, a fake gateway view) with an
injected clock: decisions applied, the freeze while starting, drain before remove, backend
errors retried at the next tick, the order of shutdown."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from servepilot.core.config import parse_config
from servepilot.core.errors import EngineStartError
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.autoscale.controller import AutoscaleController, removal_order
from servepilot.fleet.backend import Joined, ReplicaEvent, Synced, starting_ids
from servepilot.fleet.local import LocalBackend
from servepilot.scaling.snapshot import (
    FleetSnapshot,
    ReplicaSample,
    ScaleReason,
)
from servepilot.scaling.step import StepPolicy, StepRules
from tests.unit.autoscale_fakes import Scripted, rig


def test_a_busy_replica_gets_a_second_and_no_third_while_it_starts() -> None:
    rules = StepRules(min_replicas=1, max_replicas=3, up_cooldown_s=0.0, window_s=0.0)
    controller, fleet, backend, clock = rig(StepPolicy(rules), {"r0": 4})

    async def run() -> None:
        first = await controller.tick()
        assert (first.current, first.desired, first.reason) == (1, 2, ScaleReason.UP)
        assert first.direction == "up"
        assert backend.journal == ["add r1"]
        # r1 still starting and r0 still full: the rules wait for r1 (no new step).
        clock.now_s += 5
        second = await controller.tick()
        assert (second.current, second.desired, second.reason) == (2, 2, ScaleReason.STARTING)
        assert backend.journal == ["add r1"]
        # r1 joined; both full: one more step (10% of 2 is one replica).
        backend.pending.clear()
        fleet.in_flight["r1"] = 4
        clock.now_s += 5
        third = await controller.tick()
        assert (third.current, third.desired) == (2, 3)
        assert backend.journal == ["add r1", "add r2"]

    asyncio.run(run())
    assert controller.decisions == {("up", "up"): 2, ("hold", "starting"): 1}
    assert controller.last is not None and controller.last.line().startswith(
        "autoscale: 2 -> 3 replicas (up: peak utilisation 1.00"
    )


def test_removal_drains_at_the_gateway_before_the_backend_stops_it() -> None:
    controller, fleet, backend, _ = rig(Scripted(1), {"r0": 0, "r1": 1})

    async def run() -> None:
        decision = await controller.tick()
        assert (decision.current, decision.desired, decision.direction) == (2, 1, "down")
        await controller.removals_done()

    asyncio.run(run())
    # The newest ready replica goes, drained first.
    assert backend.journal == ["drain r1 within 7 s", "remove r1"]
    assert list(fleet.in_flight) == ["r0"]


def test_replicas_still_starting_go_first_without_a_drain() -> None:
    controller, _, backend, _ = rig(Scripted(1), {"r0": 0})
    backend.pending = ["r5", "r6"]

    async def run() -> None:
        await controller.tick()
        await controller.removals_done()

    asyncio.run(run())
    assert backend.journal == ["remove r6", "remove r5"]


def test_the_removal_order_starting_then_named_by_the_backend_then_newest_ready() -> None:
    def sample(rid: str, ready: bool = True) -> ReplicaSample:
        return ReplicaSample(rid, ready, 0, 0, 0, 0.0, 1.0, 4)

    snapshot = FleetSnapshot(
        0.0, (sample("r0"), sample("r1"), sample("r2"), sample("r3"), sample("r4", False))
    )
    order = [r.replica_id for r in removal_order(snapshot, {"r1"})]
    assert order == ["r4", "r1", "r3", "r2", "r0"]
    assert [r.replica_id for r in removal_order(snapshot)] == ["r4", "r3", "r2", "r1", "r0"]


def test_a_replica_the_backend_wants_back_first_goes_before_the_newest() -> None:
    controller, fleet, backend, _ = rig(Scripted(2), {"r0": 0, "r1": 0, "r2": 0})
    backend.first = frozenset({"r1"})  # e.g. on Ray, it shares a node with r0

    async def run() -> None:
        await controller.tick()
        await controller.removals_done()

    asyncio.run(run())
    assert backend.journal == ["drain r1 within 7 s", "remove r1"]
    assert list(fleet.in_flight) == ["r0", "r2"]


def test_no_change_while_a_removal_still_drains() -> None:
    controller, fleet, backend, _ = rig(Scripted(1), {"r0": 0, "r1": 0, "r2": 0})

    async def run() -> None:
        fleet.drain_gate = asyncio.Event()
        await controller.tick()  # 3 -> 1: r2 and r1 drain
        await asyncio.sleep(0)
        assert controller.removing == 2
        # Told 3 while they drain: nothing added (the removals finish first).
        controller.policy = Scripted(3)
        decision = await controller.tick()
        assert decision.desired == 3 and "add r1" not in backend.journal
        fleet.drain_gate.set()
        await controller.removals_done()

    asyncio.run(run())
    assert backend.journal == [
        "drain r2 within 7 s", "drain r1 within 7 s", "remove r2", "remove r1",
    ]  # fmt: skip


def test_a_backend_error_is_logged_and_retried_at_the_next_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controller, _, backend, clock = rig(Scripted(2), {"r0": 4})
    backend.fail_adds = 1

    async def run() -> None:
        with caplog.at_level(logging.INFO, "servepilot.fleet.autoscale"):
            await controller.tick()
            assert backend.journal == [] and controller.errors == 1
            clock.now_s += 5
            await controller.tick()

    asyncio.run(run())
    assert backend.journal == ["add r1"]
    assert "could not add a replica: OSError: no free port" in caplog.text
    assert "autoscale: 1 -> 2 replicas (hold: told so)" in caplog.text


def test_stop_ends_the_loop_then_the_removals_then_the_backend() -> None:
    controller, fleet, backend, clock = rig(Scripted(1), {"r0": 0, "r1": 0})
    controller.interval_s = 0.01

    async def run() -> None:
        fleet.drain_gate = asyncio.Event()
        controller.start()
        while "drain r1 within 7 s" not in backend.journal:
            clock.now_s += 1
            await asyncio.sleep(0.005)
        await controller.stop()
        ticks = len(backend.journal)
        await asyncio.sleep(0.05)
        assert len(backend.journal) == ticks  # nothing runs after stop

    asyncio.run(run())
    tail = [e for e in backend.journal if e != "count arrivals"]
    assert tail == ["drain r1 within 7 s", "drain r1 cancelled", "close"]
    assert "count arrivals" in backend.journal  # the loop counted arrivals between ticks


class FakeProcess:
    def __init__(self, replica_id: str, fails: bool) -> None:
        self.replica_id = replica_id
        self.url = f"http://127.0.0.1:{len(replica_id)}"
        self.pid = 7
        self.log_path = Path(f"{replica_id}.log")
        self.fails = fails
        self.loaded = asyncio.Event()

    async def wait_ready(self, timeout_s: float) -> ReplicaInfo:
        await self.loaded.wait()
        if self.fails:
            raise EngineStartError(f"{self.replica_id} exited", cause="code 1", log_tail="")
        return ReplicaInfo(self.replica_id, self.url, 7, self.log_path, None, 2.0)


class FakeReplicas:
    """LocalReplicas' launch, launch_one, ready_one, stop_one and exited, without processes
    (none shares a GPU, so each starts at once; none exits)."""

    def __init__(self, failing: set[str]) -> None:
        self.config = parse_config({}, origin="test")
        self.failing = failing
        self.processes: list[FakeProcess] = []
        self.launched: dict[str, FakeProcess] = {}
        self.stopped: list[str] = []

    def launch(self, count: int) -> None:
        for _ in range(count):
            self.launch_one()

    def launch_one(self) -> FakeProcess:
        rid = f"r{len(self.launched) + 1}"
        proc = self.launched[rid] = FakeProcess(rid, rid in self.failing)
        self.processes.append(proc)
        return proc

    def wait_line(self, replica_id: str) -> str | None:
        return None

    async def ready_one(self, proc: FakeProcess) -> ReplicaInfo:
        return await proc.wait_ready(self.config.engine.startup_timeout_s)

    async def stop_one(self, replica_id: str) -> None:
        self.processes = [p for p in self.processes if p.replica_id != replica_id]
        self.stopped.append(replica_id)

    def exited(self) -> list[tuple[FakeProcess, int]]:
        return []


def test_the_local_backend_joins_a_ready_replica_and_stops_one_that_failed() -> None:
    replicas = FakeReplicas(failing={"r3"})
    events: list[ReplicaEvent] = []

    async def run() -> None:
        backend = LocalBackend(replicas, lambda info: 5, poll_s=0.01)  # type: ignore[arg-type]
        assert await backend.start(1) == ("r1",)  # the first: up's, awaited by up
        watch = backend.watch()

        async def follow() -> None:
            async for event in watch:
                events.append(event)

        following = asyncio.ensure_future(follow())
        assert await backend.start(1) == ("r2",)
        assert await backend.start(2) == ("r3", "r4")  # the autoscaler's
        assert starting_ids(backend) == ("r1", "r2", "r3", "r4")
        replicas.launched["r2"].loaded.set()
        replicas.launched["r3"].loaded.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert starting_ids(backend) == ("r1", "r4")
        assert events == [Synced(), Joined("r2", "http://127.0.0.1:2", 5)]
        assert replicas.stopped == ["r3"]
        await backend.stop("r4")  # still starting: its wait ends, its process stops
        assert starting_ids(backend) == ("r1",) and replicas.stopped == ["r3", "r4"]
        await backend.start(1)
        await backend.close()  # waits cancelled; up stops the process with the rest
        assert replicas.stopped == ["r3", "r4"]
        following.cancel()

    asyncio.run(run())


def test_a_replica_that_never_gets_ready_is_given_up_at_the_startup_budget() -> None:
    """Without the deadline the step rules would wait on it for ever (no step while starting)."""
    rules = StepRules(min_replicas=1, max_replicas=3, up_cooldown_s=0.0, window_s=0.0)
    controller, _, backend, clock = rig(StepPolicy(rules), {"r0": 4})

    async def run() -> None:
        await controller.tick()
        assert backend.journal == ["add r1"]
        clock.now_s += 60  # exactly the budget: still waited for
        held = await controller.tick()
        assert held.reason is ScaleReason.STARTING
        assert controller.gave_up == 0
        clock.now_s += 5  # past it: r1 is removed, and r0, still full, gets a new one
        again = await controller.tick()
        assert backend.journal == ["add r1", "remove r1", "add r2"]
        assert (again.current, again.desired, again.reason) == (1, 2, ScaleReason.UP)
        assert controller.gave_up == 1
        # The clock for r2 starts when it was first seen, not at r1's.
        clock.now_s += 30
        await controller.tick()
        assert backend.journal == ["add r1", "remove r1", "add r2"]

    asyncio.run(run())


def test_a_give_up_the_backend_fails_is_tried_again_at_the_next_tick() -> None:
    controller, _, backend, clock = rig(Scripted(2), {"r0": 0})

    async def run() -> None:
        await controller.tick()
        assert backend.pending == ["r1"]
        failing = backend.stop

        async def refuse(replica_id: str) -> None:
            raise OSError("api server unreachable")

        backend.stop = refuse  # type: ignore[method-assign]
        clock.now_s += 61
        await controller.tick()
        assert (controller.gave_up, controller.errors) == (0, 1)
        backend.stop = failing  # type: ignore[method-assign]
        clock.now_s += 5
        await controller.tick()
        assert controller.gave_up == 1
        assert "remove r1" in backend.journal

    asyncio.run(run())


def test_a_drained_replica_whose_stop_fails_is_stopped_at_a_later_tick() -> None:
    # Drained, it is out of the gateway: without a retry it would run (and cost) for ever.
    controller, fleet, backend, clock = rig(Scripted(1), {"r0": 0, "r1": 0})
    refusals = 2
    stop = backend.stop

    async def flaky(replica_id: str) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise OSError("api server unreachable")
        await stop(replica_id)

    backend.stop = flaky  # type: ignore[method-assign]

    async def run() -> None:
        await controller.tick()
        await controller.removals_done()
        assert list(fleet.in_flight) == ["r0"] and controller.unstopped == {"r1"}
        assert _unstopped_gauge(controller) == 1.0
        clock.now_s += 5
        await controller.tick()  # refused again
        assert controller.unstopped == {"r1"} and controller.errors == 2
        clock.now_s += 5
        await controller.tick()
        assert controller.unstopped == set() and controller.errors == 2

    asyncio.run(run())
    assert backend.journal == ["drain r1 within 7 s", "remove r1"]
    # The gauge follows it up and back down.
    assert _unstopped_gauge(controller) == 0.0


def _unstopped_gauge(controller: AutoscaleController) -> float:
    from servepilot.fleet.autoscale.metrics import AutoscaleCollector

    for family in AutoscaleCollector(controller).collect():
        if family.name == "servepilot_autoscale_unstopped_replicas":
            return float(family.samples[0].value)
    raise AssertionError("no servepilot_autoscale_unstopped_replicas")
