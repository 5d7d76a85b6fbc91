"""The admission driver: the cycle the gateway and the simulator share, on a fake `Slots`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from servepilot.core.config import GatewayConfig, Priority
from servepilot.routing.admission import (
    BUSY_TICK_S,
    IDLE_TICK_S,
    Admission,
    AdmissionController,
    AdmissionDriver,
    AdmissionSnapshot,
    AdmitKind,
    DegradationLevel,
    FleetLoad,
    Reason,
)

P0, P1, P2 = Priority.P0, Priority.P1, Priority.P2
CALM = FleetLoad(ready_replicas=2, starting=False, mean_kv_usage=0.1, engine_waiting=0)


@dataclass
class FakeSlots:
    """`free` slots any item can take, except items of a model in `blocked`; `gone` items
    have lost their client."""

    free: int = 0
    blocked: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    placed: list[str] = field(default_factory=list)

    def place(self, item: str, now_s: float) -> bool:
        if item in self.gone:
            return True
        if self.free <= 0 or item.split(":")[0] in self.blocked:
            return False
        self.free -= 1
        self.placed.append(item)
        return True

    def any_free(self) -> bool:
        return self.free > 0


def make_driver(**sections: Any) -> AdmissionDriver[str]:
    config = GatewayConfig.model_validate(sections)
    return AdmissionDriver(config, random.Random(0))


# --- arrive -----------------------------------------------------------------------------------


def test_with_no_replica_ready_or_starting_it_is_503_before_any_rule() -> None:
    driver = make_driver(retry_after_s=7)
    decision = driver.decide(P0, free_slots=0, ready_replicas=0, starting=False, now_s=0.0)
    assert decision == Admission(AdmitKind.UNAVAILABLE_503, Reason.NO_REPLICA, 7)


def test_with_replicas_starting_it_waits_for_the_cold_start_bound() -> None:
    driver = make_driver(admission={"cold_start_wait_s": 12.5})
    decision = driver.decide(P1, free_slots=0, ready_replicas=0, starting=True, now_s=0.0)
    assert (decision.kind, decision.reason) == (AdmitKind.QUEUE, Reason.COLD_START)
    assert driver.cold_wait_s(decision) == 12.5
    queued = driver.decide(P1, free_slots=0, ready_replicas=1, starting=False, now_s=0.0)
    assert queued.reason is Reason.QUEUED and driver.cold_wait_s(queued) is None


def test_a_free_slot_beyond_the_queued_ones_dispatches() -> None:
    driver = make_driver()
    driver.enqueue("a", P0, 0.0)
    one_free = driver.decide(P1, free_slots=1, ready_replicas=1, starting=False, now_s=0.0)
    assert one_free.kind is AdmitKind.QUEUE  # the queued P0 takes that slot first
    two_free = driver.decide(P1, free_slots=2, ready_replicas=1, starting=False, now_s=0.0)
    assert two_free.kind is AdmitKind.DISPATCH


def test_the_snapshot_it_decides_on_is_the_one_the_constructor_builds() -> None:
    seen: list[AdmissionSnapshot] = []

    class Spy(AdmissionController):
        # A subclass, not a patched method: compiled, the controller's methods are read-only.
        def admit(
            self, priority: int, snapshot: AdmissionSnapshot, now_s: float, rng: random.Random
        ) -> Admission:
            seen.append(snapshot)
            return super().admit(priority, snapshot, now_s, rng)

    driver = make_driver()
    config = GatewayConfig()
    driver.controller = Spy(
        config.admission, config.protection, default_retry_after_s=config.retry_after_s
    )
    driver.enqueue("a", P0, 0.0)
    driver.enqueue("b", P2, 0.0)
    driver.dispatched(0.0)
    driver.dispatched(0.5)
    driver.decide(P1, free_slots=3, ready_replicas=2, starting=False, now_s=1.0)
    expected = AdmissionSnapshot((1, 0, 1), 3, 2, driver.rate.rate_per_s(1.0), fair_ahead=1)
    assert seen == [expected] and repr(seen[0]) == repr(expected)


def test_the_hard_limit_share_is_read_per_arrival_or_once_per_tick() -> None:
    config = GatewayConfig.model_validate(
        {"protection": {"hard_limit_ttfb_ms": 10.0, "hard_limit_shed_share": 1.0}}
    )
    per_arrival: AdmissionDriver[str] = AdmissionDriver(config, random.Random(0))
    per_tick: AdmissionDriver[str] = AdmissionDriver(
        config, random.Random(0), shed_share_per_tick=True
    )
    slots = FakeSlots()
    for driver in (per_arrival, per_tick):
        assert driver.decide(P2, 4, 1, False, 0.0).kind is AdmitKind.DISPATCH
        for _ in range(8):  # slow first bytes: the limit is crossed
            driver.release("r1", 0.5, 0.0, slots)
    assert per_arrival.decide(P2, 4, 1, False, 0.1).reason is Reason.HARD_LIMIT
    assert per_tick.decide(P2, 4, 1, False, 0.1).kind is AdmitKind.DISPATCH  # until the tick
    per_tick.tick(0.1, slots, CALM)
    assert per_tick.decide(P2, 4, 1, False, 0.2).reason is Reason.HARD_LIMIT


# --- pump and release -------------------------------------------------------------------------


def test_the_pump_grants_by_priority_then_arrival() -> None:
    driver = make_driver()
    for item, priority in [("m:p2", P2), ("m:p1-first", P1), ("m:p0", P0), ("m:p1-second", P1)]:
        driver.enqueue(item, priority, 0.0)
    slots = FakeSlots(free=3)
    driver.pump(0.1, slots)
    assert slots.placed == ["m:p0", "m:p1-first", "m:p1-second"]
    assert driver.queue.depth_by_class() == (0, 0, 1)


def test_a_blocked_head_keeps_its_place_and_the_ones_behind_take_free_slots() -> None:
    driver = make_driver()
    driver.enqueue("a:urgent", P0, 0.0)
    driver.enqueue("b:later", P1, 0.0)
    slots = FakeSlots(free=1, blocked={"a"})
    driver.pump(0.1, slots)
    assert slots.placed == ["b:later"]
    assert driver.queue.depth_by_class() == (1, 0, 0)


def test_waiters_whose_client_left_leave_the_queue_without_a_slot() -> None:
    driver = make_driver()
    driver.enqueue("m:gone", P0, 0.0)
    driver.enqueue("m:here", P1, 0.0)
    slots = FakeSlots(free=1, gone={"m:gone"})
    driver.pump(0.1, slots)
    assert slots.placed == ["m:here"] and len(driver.queue) == 0


def test_a_release_judges_the_first_byte_and_pumps_the_queue() -> None:
    driver = make_driver()
    driver.enqueue("m:waiting", P1, 0.0)
    slots = FakeSlots(free=0)
    driver.pump(0.1, slots)
    assert slots.placed == []
    slots.free = 1  # the caller freed the slot, then tells the driver
    driver.release("r1", 0.25, 0.2, slots)
    assert slots.placed == ["m:waiting"]
    assert driver.hard_limit.tracked() == {"r1"}
    driver.release("r2", None, 0.3, slots)  # a failure: not judged
    assert driver.hard_limit.tracked() == {"r1"}
    driver.forget("r1")
    assert driver.hard_limit.tracked() == set()


# --- tick -------------------------------------------------------------------------------------


def test_a_wait_expires_at_its_class_budget_on_the_injected_clock() -> None:
    driver = make_driver(admission={"queue_budget_ms": (1_000.0, 5_000.0, 9_000.0)})
    driver.enqueue("m:p0", P0, 10.0)
    driver.enqueue("m:p1", P1, 10.0)
    slots = FakeSlots()
    assert driver.tick(11.0, slots, CALM).expired == []  # exactly the budget: still waits
    assert driver.tick(11.001, slots, CALM).expired == ["m:p0"]
    assert driver.tick(15.001, slots, CALM).expired == ["m:p1"]
    assert len(driver.queue) == 0


def test_during_a_cold_start_the_budget_does_not_expire_waits() -> None:
    driver = make_driver(admission={"queue_budget_ms": (1_000.0, 5_000.0, 9_000.0)})
    driver.enqueue("m:p0", P0, 0.0)
    cold = FleetLoad(ready_replicas=0, starting=True, mean_kv_usage=0.0, engine_waiting=0)
    assert driver.tick(30.0, FakeSlots(), cold).expired == []
    down = FleetLoad(ready_replicas=0, starting=False, mean_kv_usage=0.0, engine_waiting=0)
    assert driver.tick(30.0, FakeSlots(), down).expired == ["m:p0"]


def test_the_tick_pumps_before_it_expires() -> None:
    driver = make_driver(admission={"queue_budget_ms": (1_000.0, 5_000.0, 9_000.0)})
    driver.enqueue("m:p0", P0, 0.0)
    slots = FakeSlots(free=1)
    report = driver.tick(2.0, slots, CALM)
    assert slots.placed == ["m:p0"] and report.expired == []


def test_the_tick_cadence_is_busy_while_requests_wait() -> None:
    driver = make_driver()
    slots = FakeSlots()
    assert driver.next_tick_s() == IDLE_TICK_S == 0.5
    driver.enqueue("m:a", P1, 0.0)
    assert driver.tick(0.0, slots, CALM).next_tick_s == BUSY_TICK_S == 0.02
    slots.free = 1
    assert driver.tick(0.02, slots, CALM).next_tick_s == IDLE_TICK_S


def test_the_tick_feeds_the_soft_limit_with_the_gateway_and_engine_queues() -> None:
    driver = make_driver(
        protection={"soft_limit_sustain_s": 1.0, "soft_limit_queue_per_replica": 4.0}
    )
    for index in range(3):
        driver.enqueue(f"m:{index}", P1, 0.0)
    # 3 queued here + 5 inside the engines = 4 per replica on 2 replicas: saturated.
    load = FleetLoad(ready_replicas=2, starting=False, mean_kv_usage=0.1, engine_waiting=5)
    assert driver.tick(0.0, FakeSlots(), load).degradations == []
    (event,) = driver.tick(1.0, FakeSlots(), load).degradations
    assert (event.to_level, event.reason) == (DegradationLevel.SHED_BATCH, "queue_depth")
    assert driver.decide(P2, 9, 2, False, 1.0).reason is Reason.DEGRADED


def test_a_refusal_from_the_queue_retries_after_the_queue_drains() -> None:
    driver = make_driver(retry_after_s=3)
    assert driver.queue_retry_after_s(0.0) == 3  # no rate measured yet: the default
    for index in range(11):  # 10 dispatches a second
        driver.dispatched(index * 0.1)
    for index in range(20):
        driver.enqueue(f"m:{index}", P1, 1.0)
    assert driver.queue_retry_after_s(1.0) == 2  # 20 queued, 10 dispatched a second
