"""The load: closed and open loop, stopping, warm-up, progress, several processes, honesty."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from servepilot.bench.client import Target
from servepilot.bench.drive import Tally
from servepilot.bench.records import RequestRecord, RequestSpec
from servepilot.bench.runner import (
    LoadOutcome,
    LoadPlan,
    choose_processes,
    peak_in_flight,
    run_load,
)
from servepilot.bench.runner import outcome as outcome_of
from servepilot.core import loop
from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.load.arrivals import Arrival, arrival_offsets_s
from tests.support.stub_server import StubConfig, threaded_stub

SPECS = [RequestSpec(index=i, prompt=f"p{i}", max_tokens=3, input_tokens=2) for i in range(50)]


def closed(n: float, **plan: Any) -> LoadPlan:
    return LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=n), **plan)


def rate(r: float, **plan: Any) -> LoadPlan:
    return LoadPlan(Load(mode=LoadMode.RATE, value=r), **plan)


def load(url: str, plan: LoadPlan, specs: Sequence[RequestSpec] = SPECS, **kw: Any) -> LoadOutcome:
    outcome: LoadOutcome = loop.run(run_load(Target(url, "stub-model"), plan, specs, **kw))
    return outcome


def test_peak_in_flight_counts_overlaps_not_back_to_back_requests() -> None:
    from types import SimpleNamespace

    def rec(sent_s: float, done_s: float) -> SimpleNamespace:
        return SimpleNamespace(sent_s=sent_s, extra={"done_s": done_s})

    assert peak_in_flight([]) == 0
    assert peak_in_flight([rec(0, 1), rec(1, 2), rec(2, 3)]) == 1  # type: ignore[list-item]
    assert peak_in_flight([rec(0, 3), rec(1, 2), rec(1.5, 4), rec(3, 5)]) == 3  # type: ignore[list-item]


def test_closed_loop_keeps_exactly_n_in_flight() -> None:
    with threaded_stub(StubConfig(chunks=3, chunk_delay_s=0.01)) as stub:
        outcome = load(stub.url, closed(8, max_requests=64))
        peak = stub.server.stats.max_in_flight
    assert len(outcome.records) == 64 and all(r.ok for r in outcome.records)
    assert peak == 8 and peak_in_flight(outcome.records) == 8
    assert all(r.intended_s == r.sent_s for r in outcome.records)
    assert outcome.client.requested_rate is None and outcome.client.processes == 1


def test_requests_are_used_in_order_and_cycled() -> None:
    with threaded_stub(StubConfig(chunks=1)) as stub:
        outcome = load(stub.url, closed(1, max_requests=7), SPECS[:3])
    assert [r.index for r in outcome.records] == [0, 1, 2, 0, 1, 2, 0]


def test_open_loop_is_not_slowed_by_a_stalling_server() -> None:
    """Coordinated omission: a 1 s server stall must not move later sends; their latency
    (from the intended time) includes the stall."""
    config = StubConfig(chunks=2, chunk_delay_s=0.005, stall_at_request=3, stall_s=1.0)
    with threaded_stub(config) as stub:
        outcome = load(stub.url, rate(20, max_requests=30, arrival=Arrival.CONSTANT))
    records = outcome.records
    assert len(records) == 30 and all(r.ok for r in records)
    assert [r.intended_s for r in records] == pytest.approx([i / 20 for i in range(30)])
    assert max(r.sent_s - r.intended_s for r in records) < 0.25  # on schedule, stall or not
    stalled = [r for r in records if 0.2 <= r.intended_s <= 0.9]  # sent while it was stalled
    assert stalled and all(r.chunk_s[0] >= 1.1 for r in stalled)  # stall began at 0.15 s
    assert all(r.chunk_s[0] - r.intended_s >= 0.2 for r in stalled)
    late = [r for r in records if r.intended_s >= 1.35]
    assert all(r.chunk_s[0] - r.intended_s < 0.5 for r in late)


def test_open_loop_follows_the_seeded_schedule() -> None:
    with threaded_stub(StubConfig(chunks=1)) as stub:
        outcome = load(stub.url, rate(100, max_requests=40, seed=3))
    expected = arrival_offsets_s(100, 40, Arrival.POISSON, seed=3)
    assert [r.intended_s for r in outcome.records] == pytest.approx(expected)
    health = outcome.client
    assert health.requested_rate == 100 and health.send_lag_ms.count == 40
    assert health.achieved_rate > 0 and health.send_lag_ms.p50 is not None


def test_trace_replay_uses_the_trace_times() -> None:
    trace = [RequestSpec(i, "p", 1, 1, at_s=t) for i, t in enumerate([0.0, 0.05, 0.06, 0.2])]
    with threaded_stub(StubConfig(chunks=1)) as stub:
        outcome = load(stub.url, rate(1, max_requests=6), trace)
    period = 0.2 + 0.2 / 3
    assert [r.intended_s for r in outcome.records] == pytest.approx(
        [0.0, 0.05, 0.06, 0.2, period, period + 0.05]
    )


@pytest.mark.parametrize("plan", [closed(4, duration_s=0.4), rate(50, duration_s=0.4)])
def test_stop_by_duration(plan: LoadPlan) -> None:
    with threaded_stub(StubConfig(chunks=2, chunk_delay_s=0.01)) as stub:
        outcome = load(stub.url, plan)
    assert outcome.records and all(r.ok for r in outcome.records)
    assert max(r.sent_s for r in outcome.records) < 0.6
    assert 0.35 < outcome.duration_s < 1.5


def test_requests_in_flight_at_the_end_are_cancelled_after_the_grace() -> None:
    with threaded_stub(StubConfig(chunks=5, chunk_delay_s=0.5)) as stub:
        outcome = load(stub.url, closed(3, duration_s=0.3, grace_s=0.2))
    assert len(outcome.records) == 3
    for record in outcome.records:
        assert record.error == "cancelled_at_end"
        assert 0.45 < record.end_s < 2.0  # stop at 0.3 s plus the 0.2 s grace; answers take 2.5


@pytest.mark.parametrize(
    "plan",
    [closed(2, max_requests=10, warmup_requests=5), rate(100, max_requests=10, warmup_requests=5)],
)
def test_warmup_requests_come_first_and_are_marked(plan: LoadPlan) -> None:
    with threaded_stub(StubConfig(chunks=1)) as stub:
        outcome = load(stub.url, plan)
    assert [r.warmup for r in outcome.records] == [True] * 5 + [False] * 10
    # Open loop: one lag per measured request; closed: one per measured turnaround.
    assert 8 <= outcome.client.send_lag_ms.count <= 10


def test_warmup_by_time() -> None:
    with threaded_stub(StubConfig(chunks=1)) as stub:
        outcome = load(stub.url, rate(50, duration_s=0.3, warmup_s=0.2, arrival=Arrival.CONSTANT))
    warm = [r for r in outcome.records if r.warmup]
    assert [r.intended_s for r in warm] == pytest.approx([i / 50 for i in range(10)])
    measured = [r for r in outcome.records if not r.warmup]
    assert len(measured) == 15 and min(r.intended_s for r in measured) == pytest.approx(0.2)


def test_progress_is_reported_a_few_times_a_second() -> None:
    calls: list[tuple[int, int, float]] = []
    with threaded_stub(StubConfig(chunks=2, chunk_delay_s=0.01)) as stub:
        load(
            stub.url,
            rate(40, max_requests=30, arrival=Arrival.CONSTANT),
            on_progress=lambda c, f, e: calls.append((c, f, e)),
        )
    assert len(calls) >= 3 and calls[-1][:2] == (30, 0)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    elapsed = [c[2] for c in calls[:-1]]  # the last call comes when the run ends
    assert all(b - a >= 0.15 for a, b in itertools.pairwise(elapsed))


def test_failures_are_records_not_exceptions() -> None:
    outcome = loop.run(
        run_load(Target("http://127.0.0.1:9", "m"), closed(2, max_requests=4), SPECS)
    )
    assert [r.error for r in outcome.records] == ["connect_error"] * 4


def test_several_processes_share_one_time_base() -> None:
    with threaded_stub(StubConfig(chunks=2, chunk_delay_s=0.005)) as stub:
        opened = load(stub.url, rate(40, max_requests=20, arrival=Arrival.CONSTANT, processes=2))
        shut = load(stub.url, closed(4, max_requests=40, processes=2))
        peak = stub.server.stats.max_in_flight
    assert opened.client.processes == 2 and len(opened.records) == 20
    # Each process sent every other slot; all on one schedule, so the clocks agree.
    assert [r.intended_s for r in opened.records] == pytest.approx([i / 40 for i in range(20)])
    assert max(abs(r.sent_s - r.intended_s) for r in opened.records) < 0.25
    assert len(shut.records) == 40 and all(r.ok for r in shut.records) and peak == 4
    assert sorted(r.index for r in shut.records) == list(range(40))
    assert min(r.sent_s for r in shut.records) >= 0 and peak_in_flight(shut.records) == 4


def test_process_count_rule() -> None:
    assert choose_processes(closed(1000, max_requests=1), SPECS) == 1
    assert choose_processes(rate(10, max_requests=1), SPECS) == 1
    assert choose_processes(closed(8, max_requests=1, processes=3), SPECS) == 3
    assert choose_processes(rate(1e6, max_requests=1), SPECS) >= 1


def test_plan_rejects_nonsense() -> None:
    with pytest.raises(ConfigError, match="requests or a duration"):
        closed(1)
    with pytest.raises(ConfigError, match="whole number"):
        closed(2.5, max_requests=1)
    with pytest.raises(ConfigError, match="--rate"):
        rate(0, max_requests=1)
    with pytest.raises(ConfigError, match="no requests"):
        loop.run(run_load(Target("http://h", "m"), closed(1, max_requests=1), []))


def test_a_level_with_fewer_requests_than_its_concurrency_never_reaches_its_load() -> None:
    with threaded_stub(StubConfig(chunks=3, chunk_delay_s=0.02)) as stub:
        short = load(stub.url, closed(16, max_requests=12))
        full = load(stub.url, closed(4, max_requests=12))
    assert (short.peak_in_flight, short.load_reached) == (12, False)
    assert (full.peak_in_flight, full.load_reached) == (4, True)


def test_an_open_loop_the_client_fell_behind_never_reached_its_load() -> None:
    def tally(lateness: float) -> Tally:
        # Ten requests due every 10 ms (100/s), sent `lateness` x their due time.
        records = [RequestRecord(index=i, intended_s=i / 100, sent_s=i * lateness / 100,
                                 end_s=1.0, extra={"done_s": 1.0}) for i in range(10)]  # fmt: skip
        return Tally(records=records)

    plan = rate(100, max_requests=10)
    kept = outcome_of(plan, [tally(1.0)], 0.0, 1)
    behind = outcome_of(plan, [tally(2.0)], 0.0, 1)  # sent at 50/s
    assert kept.load_reached and not behind.load_reached
    assert behind.client.achieved_rate == pytest.approx(50.0)
