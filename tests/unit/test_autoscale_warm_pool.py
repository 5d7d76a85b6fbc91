"""The controller with a warm pool, behind its seams (a fake backend, a fake gateway view, an
injected clock): up wakes pool replicas before it starts any cold, a waking or starting replica
counts as capacity on its way, down puts replicas into the pool while it is short and stops
the rest, the pool is refilled (a cold start put to sleep once it serves), an idle fleet goes
down to its minimum, and a replica that fails to start is replaced once, then reported."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from servepilot.core.config import parse_config
from servepilot.fleet.autoscale.metrics import AutoscaleCollector
from servepilot.scaling.policies import AutoscaleSetup
from tests.unit.autoscale_fakes import Scripted, rig


def test_up_wakes_the_pool_first_starts_the_rest_cold_and_refills_it() -> None:
    controller, fleet, backend, _ = rig(Scripted(3), {"r0": 4}, pool_target=1)
    fleet.held = ["p1"]

    async def run() -> None:
        decision = await controller.tick()
        await controller.removals_done()
        assert (decision.current, decision.desired) == (1, 3)
        assert decision.line().endswith("; warm pool: 1 of 1 held; wake 1, start 1, refill 1")
        # p1 serves at once (parked); r1 starts to serve, r2 to refill the pool.
        assert sorted(backend.journal) == ["add r1", "add r2", "wake p1"]
        assert controller.refilling == {"r2"} and fleet.held == []
        # r2 serves: put to sleep, never counted as capacity; nothing else changes.
        fleet.joined("r2")
        again = await controller.tick()
        await controller.removals_done()
        assert (again.current, again.desired, again.direction) == (3, 3, "hold")
        assert backend.journal[3:] == ["sleep r2"]
        assert fleet.held == ["r2"] and controller.refilling == set()
        assert (controller.wakes, controller.cold_starts) == (1, 2)

    asyncio.run(run())


def test_a_waking_replica_counts_as_capacity_on_its_way() -> None:
    controller, fleet, backend, clock = rig(Scripted(2), {"r0": 4}, pool_target=1)
    fleet.held = ["p1"]
    fleet.wake_gate = asyncio.Event()

    async def run() -> None:
        await controller.tick()
        await asyncio.sleep(0)  # the wake begins, and waits at the gate
        assert fleet.waking == {"p1"}
        for _ in range(3):  # the policy still wants 2: p1 waking is the second
            clock.now_s += 5
            held = await controller.tick()
            assert (held.current, held.desired, held.direction) == (2, 2, "hold")
        assert fleet.wake_gate is not None
        fleet.wake_gate.set()
        await controller.removals_done()

    asyncio.run(run())
    # One wake, one refill of the pool: no cascade of starts.
    assert sorted(backend.journal) == ["add r1", "wake p1"]
    assert "p1" in fleet.in_flight


def test_down_fills_the_pool_first_then_stops_and_a_cold_start_becomes_a_refill() -> None:
    controller, fleet, backend, _ = rig(Scripted(1), {"r0": 0, "r1": 0, "r2": 0}, pool_target=1)

    async def run() -> None:
        decision = await controller.tick()
        await controller.removals_done()
        assert decision.pool == "0 of 1 held; sleep 1, stop 1"

    asyncio.run(run())
    # Newest first: r2 into the pool (no stop), r1 drained and stopped.
    assert backend.journal == ["sleep r2", "drain r1 within 7 s", "remove r1"]
    assert fleet.held == ["r2"] and list(fleet.in_flight) == ["r0"]

    # A replica still starting when the fleet shrinks, the pool short: it refills the pool.
    controller, fleet, backend, _ = rig(Scripted(1), {"r0": 0}, pool_target=1)
    backend.pending = ["r5"]
    asyncio.run(controller.tick())
    assert backend.journal == [] and controller.refilling == {"r5"}


def test_an_idle_fleet_goes_down_to_its_minimum_with_its_pool_behind() -> None:
    section = parse_config({"autoscale": {"enabled": True, "min_replicas": 1, "max_replicas": 4,
                                          "interval_s": 1, "window_s": 3, "down_cooldown_s": 3}},
                           origin="t").autoscale  # fmt: skip
    policy = AutoscaleSetup.from_section(section, 40.0).build()
    idle = {f"r{i}": 0 for i in range(4)}
    controller, fleet, backend, clock = rig(policy, idle, pool_target=1)

    async def run() -> None:
        for _ in range(40):
            clock.now_s += 1
            await controller.tick()
            await controller.removals_done()

    asyncio.run(run())
    assert list(fleet.in_flight) == ["r0"] and fleet.held == ["r3"]
    assert backend.journal.count("sleep r3") == 1 and "remove r1" in backend.journal
    assert controller.last is not None and controller.last.desired == 1


def test_a_replica_that_fails_to_start_is_replaced_once_then_reported() -> None:
    controller, fleet, backend, _ = rig(Scripted(2), {"r0": 4})
    registry = CollectorRegistry()
    registry.register(AutoscaleCollector(controller))

    async def run() -> None:
        await controller.tick()
        backend.fail("r1")
        await controller.tick()  # r1 forgotten, r2 in its place
        assert backend.journal == ["add r1", "remove r1", "add r2"]
        backend.fail("r2")
        third = await controller.tick()
        assert third.note.startswith("cold starts held: r1, r2 failed to start")
        assert third.note in third.line()
        fourth = await controller.tick()
        assert (fourth.current, fourth.desired) == (1, 2)
        assert backend.journal[3:] == ["remove r2"]  # no third cold start
        # The warm pool still serves a scale-up.
        fleet.held = ["p1"]
        await controller.tick()
        await controller.removals_done()
        assert backend.journal[4:] == ["wake p1"]

    asyncio.run(run())
    text = generate_latest(registry).decode()
    assert 'servepilot_autoscale_replica_starts_total{how="failed"} 2.0' in text
    assert 'servepilot_autoscale_replica_starts_total{how="cold"} 2.0' in text
    assert 'servepilot_autoscale_replica_starts_total{how="wake"} 1.0' in text
    assert "servepilot_autoscale_cold_starts_held 1.0" in text


def test_a_start_that_gets_ready_clears_the_failures_in_a_row() -> None:
    controller, fleet, backend, _ = rig(Scripted(2), {"r0": 4})

    async def run() -> None:
        await controller.tick()
        backend.fail("r1")
        await controller.tick()  # r2 replaces r1, and gets ready
        fleet.joined("r2")
        await controller.tick()
        assert controller.starts.in_a_row == 0 and not controller.starts.held
        controller.policy = Scripted(3)
        await controller.tick()

    asyncio.run(run())
    assert backend.journal == ["add r1", "remove r1", "add r2", "add r3"]


def test_a_pool_above_its_target_is_stopped_and_without_one_sleepers_are_left_alone() -> None:
    controller, fleet, backend, _ = rig(Scripted(1), {"r0": 0}, pool_target=1)
    fleet.held = ["p1", "p2"]
    decision = asyncio.run(controller.tick())
    assert decision.pool == "2 of 1 held; drop asleep 1"
    # Out of the gateway before it is stopped: the next tick, before its backend has taken it
    # down (a pod terminating), does not count it and stop another.
    assert backend.journal == ["drain p2 within 0 s", "remove p2"]
    assert asyncio.run(controller.tick()).pool == "1 of 1 held"
    assert backend.journal[2:] == []

    # No pool (K 0): replicas put to sleep by hand stay asleep, and are woken first.
    controller, fleet, backend, _ = rig(Scripted(1), {"r0": 0})
    fleet.held = ["p1"]
    assert asyncio.run(controller.tick()).direction == "hold"
    assert backend.journal == []
    controller.policy = Scripted(2)

    async def grow() -> None:
        await controller.tick()
        await controller.removals_done()

    asyncio.run(grow())
    assert backend.journal == ["wake p1"]
