"""The SLA a tuning run aims at: latency limits on bench's per-level statistics.

`--slo ttft_p99_ms=500,tpot_p99_ms=50` sets one limit per key; a key is
`<metric>_<statistic>_ms` with metric ttft, tpot, itl or e2e and statistic p50, p90, p99 or
mean: the statistics bench reports for every level (core/results.py `Stats`). A level meets
the SLA when every limit holds for its statistic and at most 1% of its requests failed.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from servepilot.bench.metrics import Slo
from servepilot.core.errors import ConfigError
from servepilot.core.results import Run, Stats

MAX_FAILED_SHARE = 0.01
"""A level where more requests than this failed does not meet the SLA, whatever the latency."""


class Metric(enum.StrEnum):
    TTFT = "ttft"
    TPOT = "tpot"
    ITL = "itl"
    E2E = "e2e"


class Statistic(enum.StrEnum):
    P50 = "p50"
    P90 = "p90"
    P99 = "p99"
    MEAN = "mean"


@dataclass(frozen=True, slots=True)
class SloLimit:
    metric: Metric
    statistic: Statistic
    limit_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric.value}_{self.statistic.value}_ms"

    def observed_ms(self, run: Run) -> float | None:
        """The run's value of this statistic (None when the run measured none)."""
        stats: Stats = getattr(run, f"{self.metric.value}_ms")
        value: float | None = getattr(stats, self.statistic.value)
        return value


@dataclass(frozen=True, slots=True)
class Sla:
    limits: tuple[SloLimit, ...]

    def as_dict(self) -> dict[str, float]:
        return {limit.key: limit.limit_ms for limit in self.limits}

    def describe(self) -> str:
        return ", ".join(f"{k}={v:g}" for k, v in self.as_dict().items())

    def bench_slo(self) -> Slo:
        """The per-request limits bench counts goodput with (its p99 keys)."""
        per_request = {
            limit.metric: limit.limit_ms
            for limit in self.limits
            if limit.statistic is Statistic.P99 and limit.metric is not Metric.ITL
        }
        return Slo(
            ttft_ms=per_request.get(Metric.TTFT),
            tpot_ms=per_request.get(Metric.TPOT),
            e2e_ms=per_request.get(Metric.E2E),
        )


@dataclass(frozen=True, slots=True)
class Violation:
    """How one limit fares at one level: observed / limit (> 1 is a miss)."""

    key: str
    observed_ms: float
    limit_ms: float

    @property
    def ratio(self) -> float:
        return self.observed_ms / self.limit_ms


def parse_sla(text: str, flag: str = "--slo") -> Sla:
    """`ttft_p99_ms=500,tpot_p99_ms=50` -> Sla; errors name the flag and the bad part."""
    limits: dict[str, SloLimit] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        limit = _limit(key, value, text, flag) if sep else None
        if limit is None:
            raise ConfigError(
                f"{flag} {text!r}: {part.strip()!r} is not KEY=MS",
                hint="keys are <ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms, e.g. ttft_p99_ms=500",
            )
        limits[key] = limit
    if not limits:
        raise ConfigError(f"{flag} {text!r}: no limit given", hint="e.g. --slo ttft_p99_ms=500")
    return Sla(tuple(limits.values()))


def _limit(key: str, value: str, text: str, flag: str) -> SloLimit | None:
    head, _, unit = key.rpartition("_")
    metric_name, _, stat_name = head.partition("_")
    if unit != "ms":
        return None
    try:
        metric = Metric(metric_name)
    except ValueError:
        return None
    if stat_name == "p95":
        raise ConfigError(
            f"{flag} {text!r}: {key}: bench measures p50, p90, p99 and the mean, not p95",
            hint=f"use {metric_name}_p90_ms or {metric_name}_p99_ms",
        )
    try:
        statistic = Statistic(stat_name)
    except ValueError:
        return None
    try:
        limit_ms = float(value)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: {key}: {value.strip()!r} is not a number") from None
    if not math.isfinite(limit_ms) or limit_ms <= 0:
        raise ConfigError(f"{flag} {text!r}: {key} must be a positive number of ms")
    return SloLimit(metric, statistic, limit_ms)


def violations(run: Run, sla: Sla) -> tuple[Violation, ...]:
    """Each limit at this level; a statistic the run did not measure is left out."""
    out = []
    for limit in sla.limits:
        observed = limit.observed_ms(run)
        if observed is not None:
            out.append(Violation(limit.key, observed, limit.limit_ms))
    return tuple(out)


def failed_share(run: Run) -> float:
    attempted = run.completed + run.failed
    return run.failed / attempted if attempted else 1.0


def meets(run: Run, sla: Sla) -> bool:
    if run.completed == 0 or failed_share(run) > MAX_FAILED_SHARE:
        return False
    return all(v.ratio <= 1.0 for v in violations(run, sla))


def worst(run: Run, sla: Sla) -> Violation | None:
    """The limit closest to (or furthest past) its bound at this level."""
    found = violations(run, sla)
    return max(found, key=lambda v: v.ratio) if found else None
