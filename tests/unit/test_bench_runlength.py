"""bench's estimate of a run's length, on levels and paces with known answers."""

from __future__ import annotations

import dataclasses

import pytest

from servepilot.bench.client import Target
from servepilot.bench.console import estimate_line, fmt_length_s, progress_left
from servepilot.bench.runlength import (
    Pace,
    estimate,
    first_answers_pace,
    level_left_s,
    level_pace,
    level_s,
    run_loads,
)
from servepilot.bench.session import BenchOptions, BenchReporter, RunClock
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.load.arrivals import Arrival
from servepilot.load.levels import LevelOptions
from servepilot.load.loadplan import LoadPlan
from servepilot.load.sweep import SweepConfig, sweep_loads
from servepilot.load.workload import WorkloadKind, WorkloadSpec
from tests.unit.test_bench_sweep import run


def c(value: float) -> Load:
    return Load(mode=LoadMode.CONCURRENCY, value=value)


def r(value: float) -> Load:
    return Load(mode=LoadMode.RATE, value=value)


LEVELS = LevelOptions(
    workload=WorkloadSpec(kind=WorkloadKind.RANDOM, input_tokens=32, output_tokens=8),
    loads=(), sweep=SweepConfig(), requests=None, duration_s=None, warmup_requests=0,
    arrival=Arrival.POISSON, burstiness=1.0,
)  # fmt: skip
PACE = Pace(requests_per_s=0.5, latency_s=6.0, basis="test")


def test_the_sweeps_bound_doubles_up_to_its_highest_load_or_its_level_limit() -> None:
    assert [x.value for x in sweep_loads(SweepConfig())] == [2.0**i for i in range(11)]
    assert len(sweep_loads(SweepConfig(max_levels=3))) == 3
    assert [x.value for x in sweep_loads(SweepConfig(mode=LoadMode.RATE, start=2))][-1] == 1024


def test_a_sweep_of_fixed_requests_ends_at_the_first_concurrency_above_them() -> None:
    assert [x.value for x in run_loads(LEVELS)] == [2.0**i for i in range(11)]
    twenty = dataclasses.replace(LEVELS, requests=20)
    # c=32 cannot have 32 in flight with 20 requests: it ends the sweep.
    assert [x.value for x in run_loads(twenty)] == [1, 2, 4, 8, 16, 32]
    warm = dataclasses.replace(twenty, warmup_requests=20)
    assert run_loads(warm)[-1] == c(64)
    given = dataclasses.replace(LEVELS, sweep=None, loads=(c(8), c(1)))
    assert run_loads(given) == (c(8), c(1))


def test_a_duration_bound_level_is_its_duration_plus_the_drain_allowance() -> None:
    plan = LoadPlan(load=c(4), duration_s=30.0)
    assert level_s(plan, None) == 60.0  # 30 s + grace 30 s, known before any answer
    assert level_s(plan, None, short=True) == 30.0  # nothing left in flight at the end
    warm = dataclasses.replace(plan, warmup_requests=6)
    assert level_s(warm, None) is None  # the warm-up's time needs a pace
    assert level_s(warm, PACE) == pytest.approx(6 / 0.5 + 60)


def test_a_request_bound_closed_loop_from_a_pace() -> None:
    plan = LoadPlan(load=c(4), max_requests=20)
    assert level_s(plan, None) is None
    # Long end: no faster than the measured 0.5 req/s. Short end: 4 in flight, 6 s each.
    assert level_s(plan, PACE) == pytest.approx(40.0)
    assert level_s(plan, PACE, short=True) == pytest.approx(30.0)
    # One in flight at a time cannot beat its latency: 20 x 6 s at either end.
    one = LoadPlan(load=c(1), max_requests=20)
    assert level_s(one, PACE) == level_s(one, PACE, short=True) == pytest.approx(120.0)


def test_a_pace_of_nothing_gives_no_time_rather_than_a_crash() -> None:
    nothing = Pace(requests_per_s=0.0, latency_s=0.0, basis="a level of 0 requests")
    assert level_s(LoadPlan(load=c(2), max_requests=5), nothing) is None
    assert level_s(LoadPlan(load=r(2), max_requests=5), nothing) is None


def test_a_request_bound_open_loop_from_a_pace() -> None:
    plan = LoadPlan(load=r(2), max_requests=20)
    pace = Pace(requests_per_s=1.0, latency_s=3.0, basis="test")
    assert level_s(plan, pace) == pytest.approx(20 / 1 + 3)  # answered at 1/s, then a latency
    assert level_s(plan, pace, short=True) == pytest.approx(20 / 2 + 3)  # on schedule


def test_a_running_closed_loop_goes_on_at_its_own_pace() -> None:
    plan = LoadPlan(load=c(2), max_requests=20, warmup_requests=4)
    assert level_left_s(plan, None, 6, 12.0) == pytest.approx(18 * 2.0)
    duration = LoadPlan(load=c(2), duration_s=30.0)
    assert level_left_s(duration, None, 6, 12.0) == pytest.approx(48.0)


def test_paces_from_the_first_answer_and_from_a_finished_level() -> None:
    first = first_answers_pace(LoadPlan(load=c(4), max_requests=2), 5.0)
    assert (first.requests_per_s, first.latency_s) == (pytest.approx(2 / 5), 5.0)
    assert first.basis == "concurrency 4's first answer in 5.0 s"
    assert first_answers_pace(LoadPlan(load=r(3), max_requests=20), 2.0).requests_per_s == 3
    done = level_pace(run(1, 60, 8000), sent=8, wall_s=32.0)  # e2e mean 4,000 ms
    assert (done.requests_per_s, done.latency_s) == (pytest.approx(0.25), pytest.approx(4.0))


def test_the_estimate_sums_the_running_level_and_those_after_it() -> None:
    plans = [LoadPlan(load=c(v), max_requests=20) for v in (1, 2, 4)]
    e = estimate(plans, 1, PACE, sweep=False, running=(10, 20.0))
    # c=2: 10 left at its own 2 s each; c=4: 40 s (long) or 30 s (short).
    assert (e.short_s, e.left_s) == (pytest.approx(50.0), pytest.approx(60.0))
    assert estimate(plans, 0, None, sweep=False).left_s is None


def test_the_estimate_lines_say_what_they_rest_on() -> None:
    loads = (c(1), c(2), c(4))
    plans = [LoadPlan(load=x, duration_s=30.0) for x in loads]
    e = estimate(plans, 0, None, sweep=False)
    assert estimate_line(e, plans, loads) == (
        "estimate: at most 3 min left: 3 levels of 30 s each "
        "+ up to 30 s for the answers in flight to finish"
    )
    counted = [LoadPlan(load=x, max_requests=20) for x in loads]
    unknown = estimate(counted, 0, None, sweep=True)
    assert estimate_line(unknown, counted, loads) == (
        "estimate: 3 levels left, 60 requests in all; their time is estimated once the first "
        "answer is in; the sweep may stop sooner (its bound: 3 levels, c=1 to c=4)"
    )
    after = estimate(counted, 1, PACE, sweep=True)  # c=2: 60 s; c=4: 30 to 40 s: 90-100 s
    assert estimate_line(after, counted, loads).startswith(
        "level 1 of at most 3 done; estimate: 90 s to 2 min left for 2 levels, from test "
        "(the short end if throughput grows with the load, the long end if it stays flat)"
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(45, "45 s"), (89.6, "90 s"), (100, "2 min"), (720, "12 min"), (3900, "1 h 05 min")],
)
def test_lengths_read_at_a_glance(seconds: float, text: str) -> None:
    assert fmt_length_s(seconds) == text


def test_the_time_left_is_a_range_or_one_figure() -> None:
    assert progress_left(None) == ""
    assert progress_left((120.0, 720.0)) == "2-12 min left"
    assert progress_left((30.0, 30.4)) == "about 30 s left"
    assert progress_left((60.0, 300.0)) == "60 s to 5 min left"


def _clock_notes(levels: LevelOptions) -> tuple[list[str], RunClock]:
    notes: list[str] = []
    reporter = BenchReporter(lambda *_: None, lambda _: None, lambda _: None, notes.append)
    opts = BenchOptions(target=Target(base_url="http://x", model="m"), levels=levels, seed=0,
                        slo=Slo())  # fmt: skip
    clock = RunClock(opts, reporter)
    clock.start()
    return notes, clock


def test_the_run_clock_notes_a_time_once_it_has_one() -> None:
    given = dataclasses.replace(LEVELS, sweep=None, loads=(c(1), c(2)), requests=4)
    notes, clock = _clock_notes(given)
    plan = LoadPlan(load=c(1), max_requests=4)
    assert clock.progress(plan, 0, 0.2) is None
    # The first answer, 2 s in: c=1 4 x 2 s; c=2 4 x 2 s (long) or 4 x 1 s (short).
    assert clock.progress(plan, 1, 2.0) == (pytest.approx(6 + 4), pytest.approx(6 + 8))
    assert len(notes) == 2 and notes[1].startswith("estimate: 12-16 s left for 2 levels")
    clock.level_done(run(1, 60, 4000), sent=4, wall_s=8.0)
    assert notes[2].startswith("level 1 of 2 done; estimate: 4-8 s left for 1 level")

    timed = dataclasses.replace(given, requests=None, duration_s=10.0)
    notes, clock = _clock_notes(timed)
    clock.progress(LoadPlan(load=c(1), duration_s=10.0), 1, 2.0)
    assert notes == ["estimate: at most 80 s left: 2 levels of 10 s each + up to 30 s for "
                     "the answers in flight to finish"]  # fmt: skip
