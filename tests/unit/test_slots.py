"""Which request goes when (load/slots.py): the one rule bench's clients and sim's follow."""

from __future__ import annotations

import itertools

import pytest

from servepilot.core.results import Load, LoadMode
from servepilot.load.arrivals import Arrival, iter_arrival_offsets_s
from servepilot.load.loadplan import LoadPlan
from servepilot.load.slots import (
    ClosedSlots,
    Slot,
    concurrency_share,
    open_slots,
    replay_times,
    send_times,
    trace_offsets,
)

RATE = Load(mode=LoadMode.RATE, value=5.0)
CLOSED = Load(mode=LoadMode.CONCURRENCY, value=2.0)


def test_open_slots_count_warmup_first_then_stop_after_the_measured_requests() -> None:
    plan = LoadPlan(RATE, max_requests=4, warmup_requests=2)
    slots = list(open_slots(plan, 3, iter([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])))
    assert [s.request for s in slots] == [0, 1, 2, 0, 1, 2]  # position mod the pool
    assert [s.warmup for s in slots] == [True, True, False, False, False, False]
    assert slots[2] == Slot(2, 0.2, False) and isinstance(slots[2], Slot)


def test_open_slots_stop_duration_after_the_first_measured_one() -> None:
    plan = LoadPlan(RATE, duration_s=1.0, warmup_requests=1)
    slots = list(open_slots(plan, 10, (0.5 * i for i in itertools.count())))
    # Warm-up at 0.0; measured from 0.5 until (not at) 1.5.
    assert [(s.send_s, s.warmup) for s in slots] == [(0.0, True), (0.5, False), (1.0, False)]


def test_open_slots_warm_up_by_time() -> None:
    plan = LoadPlan(RATE, max_requests=2, warmup_s=0.25)
    slots = list(open_slots(plan, 10, (0.1 * i for i in itertools.count())))
    assert [s.warmup for s in slots] == [True, True, True, False, False]


@pytest.mark.parametrize(("requests", "duration"), [(30, None), (None, 4.0)])
def test_the_processes_split_the_one_global_schedule(
    requests: int | None, duration: float | None
) -> None:
    plan = LoadPlan(RATE, max_requests=requests, duration_s=duration, warmup_requests=3, seed=3)
    whole = list(open_slots(plan, 7, send_times(plan, None)))
    parts = [list(open_slots(plan, 7, send_times(plan, None), p, 3)) for p in range(3)]
    assert sorted(itertools.chain(*parts), key=lambda s: s.send_s) == whole
    assert all(len(part) >= len(whole) // 3 for part in parts)


def test_closed_slots_stop_duration_after_the_first_measured_slot() -> None:
    slots = ClosedSlots(LoadPlan(CLOSED, duration_s=10.0, warmup_requests=2), 5)
    got = [slots.next(float(t)) for t in range(100)]
    assert [(s.request, s.warmup) for s in got[:4] if s] == [
        (0, True), (1, True), (2, False), (3, False)
    ]  # fmt: skip
    assert slots.end_s == 12.0
    assert got.count(None) == 100 - 2 - 10


def test_closed_slots_share_the_measured_quota_between_processes() -> None:
    plan = LoadPlan(CLOSED, max_requests=7)
    counts = []
    for part in range(3):
        slots = ClosedSlots(plan, 100, part, 3)
        taken = []
        while (slot := slots.next(0.0)) is not None:
            taken.append(slot)
        assert all(s.request % 3 == part for s in taken)
        counts.append(len(taken))
    assert counts == [3, 2, 2]
    assert [concurrency_share(7, p, 3) for p in range(3)] == [3, 2, 2]


def test_send_times_follow_the_plans_arrivals_or_the_trace() -> None:
    plan = LoadPlan(RATE, max_requests=10, arrival=Arrival.GAMMA, burstiness=0.5, seed=9)
    expected = iter_arrival_offsets_s(5.0, Arrival.GAMMA, burstiness=0.5, seed=9)
    assert list(itertools.islice(send_times(plan, None), 20)) == list(
        itertools.islice(expected, 20)
    )
    assert list(itertools.islice(send_times(plan, [0.0, 1.0]), 3)) == [0.0, 1.0, 2.0]


def test_a_trace_repeats_after_its_span_plus_one_mean_gap() -> None:
    assert list(itertools.islice(trace_offsets([0.0, 1.0, 4.0]), 6)) == [
        0.0, 1.0, 4.0, 6.0, 7.0, 10.0
    ]  # fmt: skip
    assert list(itertools.islice(trace_offsets([3.0]), 3)) == [3.0, 4.0, 5.0]


def test_only_a_pool_where_every_request_has_a_time_replays_it() -> None:
    assert replay_times([0.0, 1.5]) == [0.0, 1.5]
    assert replay_times([0.0, None]) is None
    assert replay_times([]) is None


def test_a_slot_taken_a_hair_before_the_shared_start_is_measured() -> None:
    # Processes share one start time; one may read its clock just before it (under load):
    # without a warm-up by time that is a measured slot, within the quota, not an extra.
    slots = ClosedSlots(LoadPlan(CLOSED, max_requests=2), 5)
    first = slots.next(-0.0002)
    assert first is not None and not first.warmup
    assert slots.next(0.01) is not None and slots.next(0.02) is None
