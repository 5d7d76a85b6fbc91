"""The load sweep of one trial: bench's sweep, stopped at the SLA, then a bisection there.

Goodput at the SLA is read off the highest load that meets it, so the sweep (a pure function
of the levels run so far, like bench's `next_step`) spends its levels near that load:
1. coarse: bench's levels (1, 2, 4, ... concurrency) with bench's stop rules (throughput flat
   while P99 climbs, too many failures, the highest load allowed), and one more: the first
   level that misses the SLA ends it, since higher loads only miss it by more;
2. refine: up to `refine_levels` levels bisecting between the highest level that met the SLA
   and the lowest one above it that missed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.core.results import Load, LoadMode, Run
from servepilot.core.slo import Slo
from servepilot.load.sweep import SweepConfig, next_step
from servepilot.tune.sla import meets


@dataclass(frozen=True, slots=True)
class LoadSweep:
    mode: LoadMode = LoadMode.CONCURRENCY
    start: float = 1.0
    factor: float = 2.0
    max_value: float = 256.0
    max_levels: int = 10
    refine_levels: int = 2
    requests_per_level: int | None = None
    """Requests per level; None: bench's default (max(100, 5 x concurrency))."""

    def bench_config(self) -> SweepConfig:
        return SweepConfig(
            mode=self.mode,
            start=self.start,
            factor=self.factor,
            max_value=self.max_value,
            max_levels=self.max_levels,
        )


@dataclass(frozen=True, slots=True)
class LoadStep:
    load: Load | None
    """The next level; None when the sweep is over."""
    reason: str


def next_load(sweep: LoadSweep, sla: Slo, runs: Sequence[Run]) -> LoadStep:
    coarse = [r for r in runs if _is_coarse(sweep, r.load.value)]
    missed = [r for r in coarse if not meets(r, sla)]
    if not missed:
        step = next_step(sweep.bench_config(), coarse)
        if step.load is not None:
            return LoadStep(step.load, step.reason)
        return LoadStep(None, step.reason)
    return _refine(sweep, sla, runs)


def _refine(sweep: LoadSweep, sla: Slo, runs: Sequence[Run]) -> LoadStep:
    refined = [r for r in runs if not _is_coarse(sweep, r.load.value)]
    if len(refined) >= sweep.refine_levels:
        return LoadStep(None, f"the SLA was bracketed with {len(refined)} more level(s)")
    passing = [r.load.value for r in runs if meets(r, sla)]
    low = max(passing, default=0.0)
    above = [r.load.value for r in runs if r.load.value > low and not meets(r, sla)]
    if not above:
        return LoadStep(None, "no level above the best one missed the SLA")
    high = min(above)
    middle = _middle(sweep.mode, low, high)
    if middle is None or middle in {r.load.value for r in runs}:
        return LoadStep(None, f"the SLA lies between {low:g} and {high:g}: nothing in between")
    return LoadStep(
        Load(mode=sweep.mode, value=middle),
        f"bisecting between {low:g} (meets the SLA) and {high:g} (misses it)",
    )


def _middle(mode: LoadMode, low: float, high: float) -> float | None:
    if mode is LoadMode.CONCURRENCY:
        middle = float((int(low) + int(high)) // 2)
        return middle if low < middle < high and middle >= 1 else None
    middle = (low + high) / 2 if low > 0 else high / 2
    return middle if low < middle < high else None


def coarse_values(sweep: LoadSweep) -> tuple[float, ...]:
    """The levels the coarse phase may run, in order (bench's progression)."""
    values: list[float] = []
    value = sweep.start
    while value <= sweep.max_value and len(values) < sweep.max_levels:
        values.append(value)
        nxt = value * sweep.factor
        value = float(round(nxt)) if sweep.mode is LoadMode.CONCURRENCY else nxt
        if values and value <= values[-1]:
            break
    return tuple(values)


def _is_coarse(sweep: LoadSweep, value: float) -> bool:
    return any(abs(value - v) < 1e-9 for v in coarse_values(sweep))
