"""How long a bench run takes: the estimate printed before the first request, re-made as
answers come in and levels finish.

A duration-bound level's length follows from its flags: the duration plus up to the drain
allowance (`LoadPlan.grace_s`) that the requests in flight at its end get. A
request-bound level's length depends on how fast the target answers, so it is estimated from a
`Pace` measured on this run (the first answers, then each finished level) as a range: the long
end if the throughput stays what was measured (a saturated server), the short end if the
latency does (a server that batches more requests at no cost). A sweep's number of levels is
not known before it stops, so its estimate runs to its upper bound (`run_loads`).

No I/O here: the session feeds in what it measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.bench.report.fmt import level_name
from servepilot.core.results import Load, LoadMode, Run
from servepilot.load.levels import LevelOptions
from servepilot.load.loadplan import LoadPlan
from servepilot.load.sweep import sweep_loads


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast the target answered, as measured on this run."""

    requests_per_s: float
    latency_s: float
    basis: str
    """What it was measured on, in words: `concurrency 1's first answer in 6.0 s`."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """What is left of a run."""

    levels_done: int
    levels_total: int
    """The levels of the run; for a sweep, its upper bound."""
    sweep: bool
    left_s: float | None
    """Seconds left, the long end; None until the pace it depends on is measured."""
    short_s: float | None
    """The short end (equal to `left_s` when nothing depends on the pace)."""
    bound_only: bool
    """Every level left is duration-bound: `left_s` is an upper bound, not a guess."""
    pace: Pace | None


def run_loads(levels: LevelOptions) -> tuple[Load, ...]:
    """The loads a run goes through: the given ones, or the sweep's upper bound. With a fixed
    number of requests a level, a closed-loop sweep ends at the first concurrency above them
    (that level cannot reach its load, which stops a sweep)."""
    if levels.sweep is None:
        return levels.loads
    loads = sweep_loads(levels.sweep)
    if levels.requests is None or levels.sweep.mode is not LoadMode.CONCURRENCY:
        return loads
    most_in_flight = levels.requests + levels.warmup_requests
    for i, load in enumerate(loads):
        if load.value > most_in_flight:
            return loads[: i + 1]
    return loads


def level_s(plan: LoadPlan, pace: Pace | None, *, short: bool = False) -> float | None:
    """Seconds `plan`'s level takes (the long end, or the `short` one), or None when that
    depends on a pace not yet measured."""
    if plan.duration_s is not None:
        warmup_s = _sending_s(plan, plan.warmup_requests, pace, short=short, tail=False)
        if warmup_s is None:
            return None
        # The answers in flight at the end take from nothing to the whole allowance.
        return warmup_s + plan.duration_s + (0.0 if short else plan.grace_s)
    requests = plan.warmup_requests + (plan.max_requests or 0)
    return _sending_s(plan, requests, pace, short=short, tail=True)


def _sending_s(
    plan: LoadPlan, requests: int, pace: Pace | None, *, short: bool, tail: bool
) -> float | None:
    """Seconds to send `requests` and have them answered at `pace`."""
    if requests == 0:
        return 0.0
    if pace is None:
        return None
    if plan.closed:
        # Long end: the throughput no higher than measured, nor the latency lower (a lower
        # concurrency runs at concurrency / latency). Short end: the latency as measured.
        by_latency = plan.load.value / pace.latency_s if pace.latency_s > 0 else None
        rate = pace.requests_per_s
        if by_latency is not None:
            rate = by_latency if short else min(rate, by_latency)
        return requests / rate if rate > 0 else None
    # Open loop: sent on schedule, answered no faster than measured (short end: on time);
    # the last answer comes one latency after its send.
    rate = plan.load.value if short else min(pace.requests_per_s, plan.load.value)
    if rate <= 0:  # a level that measured nothing tells no time
        return None
    return requests / rate + (pace.latency_s if tail else 0.0)


def level_left_s(
    plan: LoadPlan, pace: Pace | None, done: int, elapsed_s: float, *, short: bool = False
) -> float | None:
    """What is left of a running level `elapsed_s` in, with `done` answers in. A closed loop
    that counts requests goes on at the pace of its own answers so far."""
    if plan.duration_s is None and plan.closed and done > 0:
        left = plan.warmup_requests + (plan.max_requests or 0) - done
        return max(left, 0) * elapsed_s / done
    whole = level_s(plan, pace, short=short)
    return None if whole is None else max(whole - elapsed_s, 0.0)


def first_answers_pace(plan: LoadPlan, elapsed_s: float) -> Pace:
    """The pace read off a level's first answer, `elapsed_s` after its start: a closed loop's
    first requests go out together and come back about together (all `concurrency` in
    `elapsed_s`); an open loop is taken to keep its schedule."""
    name = level_name(plan.load)
    basis = f"{name}'s first answer in {elapsed_s:.1f} s"
    if plan.closed:
        in_flight = plan.load.value
        if plan.max_requests is not None:
            in_flight = min(in_flight, plan.max_requests + plan.warmup_requests)
        return Pace(in_flight / elapsed_s, elapsed_s, basis)
    return Pace(plan.load.value, elapsed_s, basis)


def level_pace(run: Run, sent: int, wall_s: float) -> Pace:
    """The pace of a finished level: `sent` requests (warm-up ones included) in `wall_s`, its
    prompts' preparation included; the latency its answers had on average."""
    mean_ms = run.e2e_ms.mean
    latency_s = mean_ms / 1000 if mean_ms is not None else wall_s
    rate = sent / wall_s if wall_s > 0 else 0.0
    basis = f"the {rate:.2f} req/s and {latency_s:.1f} s latency {level_name(run.load)} measured"
    return Pace(rate, latency_s, basis)


def estimate(
    plans: Sequence[LoadPlan],
    levels_done: int,
    pace: Pace | None,
    *,
    sweep: bool,
    running: tuple[int, float] | None = None,
) -> Estimate:
    """What is left of a run of `plans` (all its levels, a sweep's to its bound) after
    `levels_done`; `running`: (answers in, seconds elapsed) of the level now running."""
    rest = plans[levels_done:]
    bound_only = all(p.duration_s is not None and not p.warmup_requests for p in rest)
    long_s = _left_s(rest, pace, running, short=False)
    short_s = _left_s(rest, pace, running, short=True)
    return Estimate(levels_done, len(plans), sweep, long_s, short_s, bound_only, pace)


def _left_s(
    rest: Sequence[LoadPlan], pace: Pace | None, running: tuple[int, float] | None, *, short: bool
) -> float | None:
    left: float | None = 0.0
    if running is not None and rest:
        left = level_left_s(rest[0], pace, *running, short=short)
        rest = rest[1:]
    for plan in rest:
        s = level_s(plan, pace, short=short)
        left = None if left is None or s is None else left + s
    return left
