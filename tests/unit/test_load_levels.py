"""A run's load levels (load/levels.py): plans, pool sizes and next levels, bench's and sim's."""

from __future__ import annotations

import dataclasses

from servepilot.core.results import Load, LoadMode, Run, Stats
from servepilot.load.arrivals import Arrival
from servepilot.load.levels import DURATION_POOL_MAX, LevelOptions, default_requests, pool_size
from servepilot.load.sweep import SweepConfig
from servepilot.load.workload import WorkloadSpec

RATE = Load(mode=LoadMode.RATE, value=10.0)
CLOSED = Load(mode=LoadMode.CONCURRENCY, value=40.0)


def _levels(**changes: object) -> LevelOptions:
    levels = LevelOptions(workload=WorkloadSpec(seed=7), loads=(RATE, CLOSED), sweep=None,
                          requests=None, duration_s=None, warmup_requests=5,
                          arrival=Arrival.GAMMA, burstiness=0.5)  # fmt: skip
    return dataclasses.replace(levels, **changes)  # type: ignore[arg-type]


def test_default_requests_give_every_worker_a_few_turns() -> None:
    assert default_requests(Load(mode=LoadMode.CONCURRENCY, value=4)) == 100
    assert default_requests(CLOSED) == 200
    assert default_requests(RATE) == 300


def test_a_level_counts_requests_unless_it_has_a_duration() -> None:
    plan = _levels().plan(RATE, seed=3, processes=2)
    assert (plan.max_requests, plan.duration_s, plan.warmup_requests) == (300, None, 5)
    assert (plan.arrival, plan.burstiness, plan.seed, plan.processes) == (Arrival.GAMMA, 0.5, 3, 2)
    assert _levels(requests=50).plan(RATE, seed=0).max_requests == 50
    timed = _levels(requests=50, duration_s=20.0).plan(RATE, seed=0)
    assert (timed.max_requests, timed.duration_s) == (None, 20.0)
    soak = _levels(duration_s=20.0).plan(RATE, seed=0, soak_s=600.0)
    assert (soak.max_requests, soak.duration_s) == (None, 600.0)


def test_the_pool_holds_every_request_or_enough_for_the_duration() -> None:
    assert pool_size(_levels(requests=50).plan(RATE, seed=0)) == 55
    # 10 req/s x 20 s x 1.2 + warm-up + 100; the closed loop counts 4 requests/s per worker.
    assert pool_size(_levels(duration_s=20.0).plan(RATE, seed=0)) == 240 + 5 + 100
    assert pool_size(_levels(duration_s=20.0).plan(CLOSED, seed=0)) == 3840 + 5 + 100
    assert pool_size(_levels(duration_s=3600.0).plan(RATE, seed=0)) == DURATION_POOL_MAX == 20_000


def test_each_level_has_its_own_workload_seed() -> None:
    levels = _levels()
    assert [levels.level_workload(i).seed for i in range(3)] == [7, 8, 9]
    assert levels.level_workload(2).input_tokens == levels.workload.input_tokens


def _run(load: Load) -> Run:
    s = Stats(mean=1.0, p50=1.0, p90=1.0, p99=1.0, count=10)
    return Run(
        load=load, duration_s=1.0, completed=10, failed=0, request_throughput=10.0,
        output_throughput=100.0, total_token_throughput=200.0, ttft_ms=s, tpot_ms=s, itl_ms=s,
        e2e_ms=s, goodput_rps=0.0, slo_attainment=1.0,
    )  # fmt: skip


def test_the_next_level_is_the_next_given_one_or_the_sweeps() -> None:
    levels = _levels()
    assert levels.next_level([]).load == RATE
    assert levels.next_level([_run(RATE)]).load == CLOSED
    assert levels.next_level([_run(RATE), _run(CLOSED)]).load is None
    sweep = _levels(loads=(), sweep=SweepConfig(start=2.0, max_levels=1))
    assert sweep.next_level([]).load == Load(mode=LoadMode.CONCURRENCY, value=2.0)
    assert "limit of 1 levels" in sweep.next_level([_run(CLOSED)]).reason
