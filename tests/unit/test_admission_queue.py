"""Admission: the per-class queue, the arrival decision and the dispatch-rate meter."""

from __future__ import annotations

import random

import pytest

from servepilot.core.config import AdmissionConfig, Priority, ProtectionConfig
from servepilot.routing.admission import (
    Admission,
    AdmissionController,
    AdmissionQueue,
    AdmissionSnapshot,
    AdmitKind,
    DegradationLevel,
    RateMeter,
    Reason,
    free_slots,
)
from servepilot.routing.base import ReplicaView

P0, P1, P2 = Priority.P0, Priority.P1, Priority.P2


def make_queue(
    aging_s: float = 10.0, budget_ms: tuple[float, float, float] = (2e3, 1e4, 3e4)
) -> AdmissionQueue[str]:
    return AdmissionQueue(aging_s, budget_ms)


def drain(queue: AdmissionQueue[str], now_s: float) -> list[str]:
    out: list[str] = []
    while (item := queue.pop(now_s)) is not None:
        out.append(item)
    return out


# --- queue: ordering ---------------------------------------------------------------------


def test_pop_serves_p0_then_p1_then_p2_fifo_within_each_class() -> None:
    queue = make_queue()
    for name, prio in [("b1", P1), ("c1", P2), ("a1", P0), ("b2", P1), ("a2", P0), ("c2", P2)]:
        queue.push(name, prio, now_s=0.0)
    assert drain(queue, now_s=1.0) == ["a1", "a2", "b1", "b2", "c1", "c2"]


def test_aging_promotes_one_class_per_aging_period() -> None:
    # aging_s = 10: effective class = max(0, priority - floor(wait_s / 10)).
    queue = make_queue(aging_s=10.0)
    queue.push("p2_old", P2, now_s=0.0)  # at t=20 it has waited 2 x aging_s: effective P0
    queue.push("p1_fresh", P1, now_s=20.0)  # effective P1
    assert queue.pop(now_s=20.0) == "p2_old"
    assert queue.pop(now_s=20.0) == "p1_fresh"


def test_aged_request_ties_with_the_class_it_reached_and_wins_by_arrival() -> None:
    queue = make_queue(aging_s=10.0)
    queue.push("p2_old", P2, now_s=0.0)
    queue.push("p0_fresh", P0, now_s=20.0)  # same effective class 0: earliest arrival first
    assert drain(queue, now_s=20.0) == ["p2_old", "p0_fresh"]


def test_aging_is_floored_a_p2_just_short_of_one_period_stays_behind_p1() -> None:
    queue = make_queue(aging_s=10.0)
    queue.push("p2", P2, now_s=0.0)
    queue.push("p1", P1, now_s=9.0)
    assert queue.pop(now_s=9.99) == "p1"  # p2 waited 9.99 s: still effective P2
    queue.push("p1_late", P1, now_s=10.0)
    # p2 has now waited exactly one period: effective P1, and it arrived first.
    assert drain(queue, now_s=10.0) == ["p2", "p1_late"]


def test_pop_if_offers_what_pop_returns_and_leaves_it_in_place_when_declined() -> None:
    queue = make_queue(aging_s=10.0)
    offered: list[str] = []

    def decline(item: str, now_s: float) -> bool:
        offered.append(item)
        return False

    assert not queue.pop_if(0.0, decline) and offered == []
    ticket = queue.push("p2", P2, now_s=0.0)
    queue.push("p1", P1, now_s=5.0)
    assert not queue.pop_if(5.0, decline)
    assert not queue.pop_if(20.0, decline)  # p2 aged to effective P0
    assert offered == ["p1", "p2"]
    assert queue.depth() == 2
    assert ticket.queued
    assert queue.pop_if(20.0, lambda item, now_s: item == "p2")
    assert not ticket.queued and queue.depth() == 1


def test_push_with_a_clock_that_steps_back_keeps_fifo_order() -> None:
    queue = make_queue()
    first = queue.push("first", P1, now_s=5.0)
    second = queue.push("second", P1, now_s=4.0)
    assert second.arrival_s == first.arrival_s == 5.0
    assert drain(queue, now_s=6.0) == ["first", "second"]


def test_unknown_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="priority"):
        make_queue().push("x", 3, now_s=0.0)
    with pytest.raises(ValueError, match="priority"):
        make_queue().push("x", -1, now_s=0.0)


# --- queue: removal, expiry, accounting --------------------------------------------------


def test_removed_request_is_never_popped_and_removal_is_reported_once() -> None:
    queue = make_queue()
    a = queue.push("a", P1, now_s=0.0)
    b = queue.push("b", P1, now_s=0.0)
    assert queue.remove(a) is True
    assert queue.remove(a) is False
    assert not a.queued
    assert queue.depth() == 1
    assert queue.pop(now_s=0.0) == "b"
    assert queue.remove(b) is False  # already popped
    assert queue.pop(now_s=0.0) is None


def test_expired_returns_requests_past_their_own_class_budget() -> None:
    queue = make_queue(aging_s=1000.0, budget_ms=(1000.0, 2000.0, 3000.0))
    queue.push("p0_a", P0, now_s=0.0)
    queue.push("p1", P1, now_s=0.0)
    queue.push("p2", P2, now_s=0.0)
    queue.push("p0_b", P0, now_s=0.5)
    assert queue.expired(now_s=1.0) == []  # waited exactly the budget: not longer
    assert queue.expired(now_s=1.25) == ["p0_a"]
    assert queue.expired(now_s=2.6) == ["p0_b", "p1"]
    assert queue.depth_by_class() == (0, 0, 1)
    assert queue.expired(now_s=3.5) == ["p2"]
    assert queue.depth() == 0


def test_expired_skips_removed_requests() -> None:
    queue = make_queue(budget_ms=(1000.0, 1000.0, 1000.0))
    gone = queue.push("gone", P1, now_s=0.0)
    queue.push("stays", P1, now_s=0.0)
    queue.remove(gone)
    assert queue.expired(now_s=2.0) == ["stays"]


def test_depth_and_memory_return_to_zero_after_pops_removes_and_expiries() -> None:
    queue = make_queue(budget_ms=(1000.0, 1000.0, 1000.0))
    tickets = [queue.push(f"r{i}", i % 3, now_s=i * 0.01) for i in range(300)]
    assert queue.depth() == len(queue) == 300
    assert queue.depth_by_class() == (100, 100, 100)
    for ticket in tickets[::3]:
        queue.remove(ticket)
    popped = [queue.pop(now_s=3.0) for _ in range(50)]
    assert None not in popped
    assert queue.depth() == 150
    expired = queue.expired(now_s=100.0)
    assert len(expired) == 150
    assert queue.depth() == 0
    assert queue.depth_by_class() == (0, 0, 0)
    assert queue.held() == 0
    assert queue.oldest_wait_s(now_s=100.0) == 0.0
    assert queue.pop(now_s=100.0) is None
    assert all(not t.queued for t in tickets)


def test_removing_everything_frees_the_memory_at_once() -> None:
    queue = make_queue()
    tickets = [queue.push(str(i), P2, now_s=0.0) for i in range(10)]
    for ticket in tickets:
        queue.remove(ticket)
    assert queue.depth() == 0
    assert queue.held() == 0


def test_oldest_wait_is_that_of_the_earliest_live_arrival() -> None:
    queue = make_queue()
    first = queue.push("first", P2, now_s=1.0)
    queue.push("second", P0, now_s=3.0)
    assert queue.oldest_wait_s(now_s=5.0) == 4.0
    queue.remove(first)
    assert queue.oldest_wait_s(now_s=5.0) == 2.0


def test_pop_looks_only_at_class_heads_with_a_hundred_thousand_queued() -> None:
    queue = make_queue(aging_s=1e9)
    n = 100_000
    tickets = [queue.push(f"b{i}", P2, now_s=0.0) for i in range(n)]
    queue.push("urgent", P0, now_s=1.0)
    assert queue.pop(now_s=1.0) == "urgent"
    assert [queue.pop(now_s=1.0) for _ in range(3)] == ["b0", "b1", "b2"]
    # Removing all but the last leaves the memory bounded by what still waits...
    for ticket in tickets[3:-1]:
        queue.remove(ticket)
    assert queue.depth() == 1
    assert queue.held() <= 64 + 1
    # ...and the next pop reaches the survivor without scanning the removed ones.
    assert queue.pop(now_s=1.0) == f"b{n - 1}"
    assert queue.held() == 0


# --- decision ----------------------------------------------------------------------------

ADMISSION = AdmissionConfig(max_queued=10, cold_start_wait_s=60.0)
PROTECTION = ProtectionConfig(degraded_max_tokens=256)
CONTROLLER = AdmissionController(ADMISSION, PROTECTION, default_retry_after_s=2)


def snap(
    queued: tuple[int, int, int] = (0, 0, 0),
    free: int = 0,
    ready: int = 2,
    rate: float = 0.0,
    level: DegradationLevel = DegradationLevel.NORMAL,
    shed_share: float = 0.0,
) -> AdmissionSnapshot:
    return AdmissionSnapshot(queued, free, ready, rate, level, shed_share)


def shed(reason: Reason, retry_after_s: int) -> Admission:
    return Admission(AdmitKind.SHED_429, reason, retry_after_s)


DISPATCH = Admission(AdmitKind.DISPATCH, Reason.FREE_SLOT)
QUEUE = Admission(AdmitKind.QUEUE, Reason.QUEUED)
CAPPED_DISPATCH = Admission(AdmitKind.DISPATCH, Reason.FREE_SLOT, max_tokens_cap=256)
CAPPED_QUEUE = Admission(AdmitKind.QUEUE, Reason.QUEUED, max_tokens_cap=256)
SHED_BATCH, CAP_TOKENS = DegradationLevel.SHED_BATCH, DegradationLevel.CAP_TOKENS

CASES: list[tuple[str, int, AdmissionSnapshot, Admission]] = [
    # No ready replica: cold-start buffering while the queue has room.
    ("cold start", P1, snap(ready=0), Admission(AdmitKind.QUEUE, Reason.COLD_START)),
    ("cold start full", P0, snap((0, 4, 6), ready=0), shed(Reason.QUEUE_FULL, 2)),
    # Degradation: P2 refused from SHED_BATCH on, P1 capped at CAP_TOKENS, P0 untouched.
    (
        "degraded P2",
        P2,
        snap((0, 0, 6), free=9, rate=4.0, level=SHED_BATCH),
        shed(Reason.DEGRADED, 2),
    ),
    ("degraded P1", P1, snap(free=1, level=SHED_BATCH), DISPATCH),
    ("capped P1", P1, snap(free=1, level=CAP_TOKENS), CAPPED_DISPATCH),
    ("capped P1 queued", P1, snap(level=CAP_TOKENS), CAPPED_QUEUE),
    ("P0 never capped", P0, snap(free=1, level=CAP_TOKENS), DISPATCH),
    ("capped P2 shed", P2, snap(free=1, level=CAP_TOKENS), shed(Reason.DEGRADED, 2)),
    ("retry at least 1", P2, snap(free=1, rate=5.0, level=SHED_BATCH), shed(Reason.DEGRADED, 1)),
    # Hard limit (share 1.0 makes the draw certain; the odds are tested in test_limits).
    ("hard limit P2", P2, snap(free=1, shed_share=1.0), shed(Reason.HARD_LIMIT, 2)),
    ("hard limit P1", P1, snap(free=1, shed_share=1.0), DISPATCH),
    # Dispatch when the free slots outnumber what is queued in its class and above.
    ("free slot", P1, snap(free=1), DISPATCH),
    ("P0 jumps queued P2", P0, snap((0, 0, 5), free=1), DISPATCH),
    ("slot taken by queued", P2, snap((0, 0, 1), free=1), QUEUE),
    ("slots to spare", P1, snap((1, 0, 0), free=3), DISPATCH),
    # Queue full: Retry-After is the drain time of the whole queue (10 / 2 per s).
    ("queue full", P0, snap((0, 4, 6), rate=2.0), shed(Reason.QUEUE_FULL, 5)),
    ("queue full, no rate", P0, snap((0, 4, 6)), shed(Reason.QUEUE_FULL, 2)),
    # Queue budget: predicted wait = queued ahead / rate, against 2 s / 10 s / 30 s.
    ("P0 over budget", P0, snap((3, 0, 0), rate=1.0), shed(Reason.QUEUE_BUDGET, 3)),
    ("P0 at budget", P0, snap((2, 5, 0), rate=1.0), QUEUE),
    ("P2 over budget", P2, snap((0, 0, 9), rate=0.25), shed(Reason.QUEUE_BUDGET, 36)),
    ("P2 no rate yet", P2, snap((0, 0, 9)), QUEUE),
    ("P1 ignores P2 ahead", P1, snap((0, 1, 8), rate=0.1), QUEUE),
    ("retry capped", P0, snap((5, 0, 0), rate=0.05), shed(Reason.QUEUE_BUDGET, 60)),
]


@pytest.mark.parametrize(
    ("priority", "snapshot", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_admission_rules(priority: int, snapshot: AdmissionSnapshot, expected: Admission) -> None:
    assert CONTROLLER.admit(priority, snapshot, now_s=0.0, rng=random.Random(0)) == expected


def test_no_ready_replica_and_no_cold_start_wait_is_503() -> None:
    controller = AdmissionController(
        ADMISSION.model_copy(update={"cold_start_wait_s": 0.0}), PROTECTION
    )
    decision = controller.admit(P0, snap(ready=0), now_s=0.0, rng=random.Random(0))
    assert decision == Admission(AdmitKind.UNAVAILABLE_503, Reason.NO_REPLICA, 2)


def test_max_queued_zero_means_never_queue_not_refuse_all() -> None:
    controller = AdmissionController(ADMISSION.model_copy(update={"max_queued": 0}), PROTECTION)
    rng = random.Random(0)
    assert controller.admit(P1, snap(free=1), 0.0, rng).kind is AdmitKind.DISPATCH
    assert controller.admit(P1, snap(free=0), 0.0, rng) == shed(Reason.QUEUE_FULL, 2)


def test_retry_after_is_whole_seconds_of_drain_time() -> None:
    assert CONTROLLER.retry_after_s(5, 2.0) == 3
    assert CONTROLLER.retry_after_s(21, 0.7) == 30  # 21 / 0.7 is 30.000000000000004 in floats
    assert CONTROLLER.retry_after_s(0, 2.0) == 1
    assert CONTROLLER.retry_after_s(10_000, 1.0) == 60
    assert CONTROLLER.retry_after_s(10, 0.0) == 2


def test_rng_is_drawn_only_for_p2_under_the_hard_limit() -> None:
    rng = random.Random(7)
    before = rng.getstate()
    for prio in (P0, P1):
        CONTROLLER.admit(prio, snap(free=1, shed_share=0.5), 0.0, rng)
    CONTROLLER.admit(P2, snap(free=1), 0.0, rng)
    assert rng.getstate() == before


def test_snapshot_counts_free_slots_over_ready_replicas() -> None:
    replicas = [
        ReplicaView("roomy", in_flight=1, capacity=4),  # 3 free
        ReplicaView("over", in_flight=5, capacity=2),  # over budget: 0, not -3
        ReplicaView("kv_full", in_flight=0, capacity=8, kv_cache_usage=0.95),  # full: 0
        ReplicaView("kv_ok", in_flight=0, capacity=2, kv_cache_usage=0.94),  # 2 free
    ]
    assert free_slots(replicas, kv_full_usage=0.95) == 5
    snapshot = AdmissionSnapshot.of(replicas, (1, 2, 3), kv_full_usage=0.95)
    assert (snapshot.free_slots, snapshot.ready_replicas, snapshot.queued_total) == (5, 4, 6)
    assert [snapshot.queued_ahead(p) for p in (P0, P1, P2)] == [1, 3, 6]


# --- dispatch rate -----------------------------------------------------------------------


def test_rate_meter_needs_two_events() -> None:
    meter = RateMeter(tau_s=10.0)
    assert meter.rate_per_s(5.0) == 0.0
    meter.record(5.0)
    assert meter.rate_per_s(5.0) == 0.0
    assert meter.rate_per_s(6.0) == 0.0
    meter.record(5.5)
    assert meter.rate_per_s(5.5) == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("until_s", [1.0, 5.0, 100.0])
def test_rate_meter_tracks_a_steady_rate_from_the_start(until_s: float) -> None:
    meter = RateMeter(tau_s=10.0)
    steps = int(until_s / 0.5)
    for i in range(steps + 1):
        meter.record(i * 0.5)
    assert meter.rate_per_s(until_s) == pytest.approx(2.0, rel=0.05)


def test_rate_meter_fades_when_events_stop() -> None:
    meter = RateMeter(tau_s=10.0)
    for i in range(201):
        meter.record(i * 0.5)
    assert meter.rate_per_s(130.0) < 0.15  # 30 s = 3 tau of silence: ~2 x e^-3
