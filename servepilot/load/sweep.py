"""The sweep and the sweet spot: which load to try next, when to stop, which load is best.

Seed 004's rule: raise the load until throughput tops out while P99 starts to degrade; the
sweet spot is where throughput is near its plateau just before P99 turns sharply up. These are
pure functions of the runs so far, so `tune` and `sim` reuse them unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.core.results import Load, LoadMode, Run, SweetSpot


@dataclass(frozen=True, slots=True)
class SweepConfig:
    mode: LoadMode = LoadMode.CONCURRENCY
    start: float = 1.0
    """First load level (concurrency, or requests per second)."""
    factor: float = 2.0
    """Each level is the previous one times this."""
    max_value: float = 1024.0
    max_levels: int = 12
    plateau_gain: float = 0.05
    """A level whose throughput beats the best so far by less than this share is flat."""
    patience: int = 2
    """Stop after this many flat levels in a row while P99 keeps climbing."""
    max_failed_share: float = 0.10
    """Stop once more than this share of a level's requests fail (the target is overloaded)."""
    plateau_share: float = 0.90
    """The sweet spot is the lowest load reaching this share of peak throughput."""


@dataclass(frozen=True, slots=True)
class SweepStep:
    load: Load | None
    """The next load to run; None when the sweep is over."""
    reason: str


def next_step(config: SweepConfig, runs: Sequence[Run]) -> SweepStep:
    """The next load of the sweep given the runs so far (in the order they ran)."""
    if not runs:
        return SweepStep(Load(mode=config.mode, value=config.start), "first level")
    last = runs[-1]
    attempted = last.completed + last.failed
    if attempted and last.failed / attempted > config.max_failed_share:
        return SweepStep(None, f"at {_fmt(last.load)}, {failure_shares(last)}")
    if not last.load_reached:
        return SweepStep(
            None, f"{_fmt(last.load)} never reached its load: a higher level would not add any"
        )
    flat = _flat_levels(config, runs)
    if flat >= config.patience and _p99_climbing(runs[-flat - 1 :]):
        return SweepStep(
            None,
            f"throughput stopped rising for {flat} levels while P99 latency kept climbing",
        )
    if len(runs) >= config.max_levels:
        return SweepStep(None, f"reached the limit of {config.max_levels} levels")
    value = _next_value(config, last.load.value)
    if value > config.max_value:
        return SweepStep(None, f"reached the highest load allowed ({config.max_value:g})")
    return SweepStep(Load(mode=config.mode, value=value), "throughput still rising")


def sweep_loads(config: SweepConfig) -> tuple[Load, ...]:
    """Every load the sweep may run, in order: its upper bound, the levels `next_step` gives
    when nothing stops it sooner."""
    loads = [Load(mode=config.mode, value=config.start)]
    while len(loads) < config.max_levels:
        value = _next_value(config, loads[-1].value)
        if value > config.max_value:
            break
        loads.append(Load(mode=config.mode, value=value))
    return tuple(loads)


def failure_shares(run: Run) -> str:
    """What became of a run's requests, refusals apart from other failures:
    `98% of 20,490 requests were refused by the server (429/503), 2% completed`."""
    attempted = run.completed + run.failed
    if not attempted:
        return "no request was sent"
    other = run.failed - run.refused
    parts = [
        (run.refused, "were refused by the server (429/503)"),
        (other, "failed"),
        (run.completed, "completed"),
    ]
    words = [f"{_pct(n, attempted)} {what}" for n, what in parts if n]
    head, *rest = words
    head = head.replace(" ", f" of {attempted:,} requests ", 1)
    return ", ".join([head, *rest])


def _pct(count: int, total: int) -> str:
    share = 100 * count / total
    # Never round a few requests to "0%" or nearly all to "100%".
    if 0 < share < 1:
        return "<1%"
    if 99 < share < 100:
        return ">99%"
    return f"{share:.0f}%"


def sweet_spot(
    runs: Sequence[Run], *, slo_set: bool, plateau_share: float = 0.90
) -> SweetSpot | None:
    """The best load among `runs`, with the reason (None when no run completed anything).

    A level that never reached its load (`load_reached` false) is not a candidate: its
    numbers describe a lighter load than its name says."""
    usable = sorted((r for r in runs if r.completed and r.load_reached), key=lambda r: r.load.value)
    if not usable:
        return None
    if slo_set:
        # A level that missed a limit on its statistics (Run.slo_met) is no sweet spot.
        usable = [r for r in usable if r.slo_met is not False]
        if not usable:
            return None
        best = max(usable, key=lambda r: (r.goodput_rps, -r.load.value))
        return SweetSpot(
            load=best.load,
            reason=f"highest goodput: {best.goodput_rps:.2f} req/s meet every SLO "
            f"({100 * best.slo_attainment:.0f}% of requests) at {_fmt(best.load)}",
        )
    peak = max(_throughput(r) for r in usable)
    index = next(i for i, r in enumerate(usable) if _throughput(r) >= plateau_share * peak)
    chosen = usable[index]
    share = 100 * _throughput(chosen) / peak if peak else 100.0
    head = f"throughput is {share:.0f}% of its peak ({peak:.1f} tok/s) at {_fmt(chosen.load)}"
    if index + 1 == len(usable):
        if any(not r.load_reached for r in runs):
            return SweetSpot(
                load=chosen.load,
                reason=f"{head}, the highest load that ran at its level (higher ones never "
                "reached theirs): throughput may still rise, try higher with more requests",
            )
        return SweetSpot(
            load=chosen.load,
            reason=f"{head}, the highest load tested: throughput may still rise, try higher",
        )
    beyond = usable[-1]
    gain = 100 * (_throughput(beyond) / _throughput(chosen) - 1)
    rise = _rise_pct(chosen, beyond)
    return SweetSpot(
        load=chosen.load,
        reason=f"{head}; going to {_fmt(beyond.load)} adds {gain:+.0f}% throughput "
        f"for {rise:+.0f}% P99 latency",
    )


def _flat_levels(config: SweepConfig, runs: Sequence[Run]) -> int:
    """How many of the latest levels in a row failed to beat the best earlier throughput."""
    flat = 0
    for i in range(len(runs) - 1, 0, -1):
        best_before = max(_throughput(r) for r in runs[:i])
        if _throughput(runs[i]) < best_before * (1 + config.plateau_gain):
            flat += 1
        else:
            break
    return flat


def _p99_climbing(window: Sequence[Run]) -> bool:
    p99s = [_p99(r) for r in window]
    known = [p for p in p99s if p is not None]
    return len(known) >= 2 and known[-1] > known[0]


def _p99(run: Run) -> float | None:
    return run.e2e_ms.p99 if run.e2e_ms.p99 is not None else run.ttft_ms.p99


def _rise_pct(a: Run, b: Run) -> float:
    pa, pb = _p99(a), _p99(b)
    if pa is None or pb is None or pa <= 0:
        return 0.0
    return 100 * (pb / pa - 1)


def _throughput(run: Run) -> float:
    # Output tokens per second is what a serving fleet sells; request rate is the fallback
    # for targets that report no token counts.
    return run.output_throughput or run.request_throughput


def _next_value(config: SweepConfig, value: float) -> float:
    nxt = value * config.factor
    return float(round(nxt)) if config.mode is LoadMode.CONCURRENCY else nxt


def _fmt(load: Load) -> str:
    if load.mode is LoadMode.CONCURRENCY:
        return f"concurrency {load.value:g}"
    return f"{load.value:g} req/s"
