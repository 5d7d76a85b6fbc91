"""Whether a load level meets the SLA: tune's checks of an `Slo` on bench's per-level statistics.

A level meets the SLA when every limit holds for its statistic (core/slo.py), the per-request
p99 limits included, and at most 1% of its requests failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.results import Run
from servepilot.core.slo import Slo

MAX_FAILED_SHARE = 0.01
"""A level where more requests than this failed does not meet the SLA, whatever the latency."""


@dataclass(frozen=True, slots=True)
class Violation:
    """How one limit fares at one level: observed / limit (> 1 is a miss)."""

    key: str
    observed_ms: float
    limit_ms: float

    @property
    def ratio(self) -> float:
        return self.observed_ms / self.limit_ms


def violations(run: Run, sla: Slo) -> tuple[Violation, ...]:
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


def meets(run: Run, sla: Slo) -> bool:
    if run.completed == 0 or failed_share(run) > MAX_FAILED_SHARE:
        return False
    return all(v.ratio <= 1.0 for v in violations(run, sla))


def worst(run: Run, sla: Slo) -> Violation | None:
    """The limit closest to (or furthest past) its bound at this level."""
    found = violations(run, sla)
    return max(found, key=lambda v: v.ratio) if found else None
