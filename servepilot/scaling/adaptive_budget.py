"""Seed 003's adaptive batch thresholds: the per-replica admission budget the measured arrival
rate calls for.

Three bands of the rate (the mean of the last `window_s` seconds of arrivals, fleet-wide or
per ready replica): below `low_rps` the low band's budget, above `peak_rps` the peak band's,
the middle one's between. A line is crossed only once the rate is past it by the `hysteresis`
share (up across a line x above x * (1 + h), down across it below x * (1 - h)), so a rate
hovering at a line keeps the band it has. The first decision takes the band the rate lies in.

The budget is requests in flight per replica at the gateway; `BudgetDecision.applied` keeps it
within what a replica holds (max_num_seqs, or what its KV cache holds) and at least 1. The
controller and the simulator apply the same decision to their replicas.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from servepilot.core.config import AdaptiveBudgetConfig, RateBasis
from servepilot.scaling.snapshot import FleetSnapshot


class Band(enum.Enum):
    """Which side of the lines the rate is on (a metric label: stable values)."""

    LOW = "low"
    MIDDLE = "middle"
    PEAK = "peak"


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    budget: int
    """Requests in flight per replica (before `applied` caps it at a replica's own limit)."""
    band: Band
    rate_rps: float
    """The rate compared with the lines (fleet-wide or per replica, as configured)."""
    detail: str
    """The numbers behind it, for a log line."""

    def applied(self, hard_capacity: int) -> int:
        """The budget for a replica that holds `hard_capacity` requests at most."""
        return max(1, min(self.budget, hard_capacity))


class AdaptiveBudget:
    """Keeps the band between decisions (the hysteresis); one per fleet, or per simulated
    level."""

    def __init__(self, config: AdaptiveBudgetConfig) -> None:
        self.config = config
        self.band: Band | None = None

    def decide(self, snapshot: FleetSnapshot) -> BudgetDecision:
        config = self.config
        rate = measured_rate(snapshot, config)
        self.band = band = next_band(self.band, rate, config)
        budget = {Band.LOW: config.low_budget, Band.MIDDLE: config.middle,
                  Band.PEAK: config.peak_budget}[band]  # fmt: skip
        per = "req/s" if config.rate is RateBasis.FLEET else "req/s per replica"
        detail = (
            f"{rate:.1f} {per} over {config.window_s} s, lines {config.low_rps:g}/"
            f"{config.peak_rps:g}: {band.value}"
        )
        return BudgetDecision(budget, band, rate, detail)


def measured_rate(snapshot: FleetSnapshot, config: AdaptiveBudgetConfig) -> float:
    """The mean of the last `window_s` closed seconds (fewer at the start; none: 0), per
    ready replica when the lines are per replica."""
    recent = snapshot.arrivals_per_s[-config.window_s :]
    rate = sum(recent) / len(recent) if recent else 0.0
    if config.rate is RateBasis.REPLICA:
        rate /= max(1, snapshot.ready)
    return rate


def next_band(band: Band | None, rate: float, config: AdaptiveBudgetConfig) -> Band:
    """The band after `band` at `rate` (None: no band yet, no hysteresis)."""
    low, peak = config.low_rps, config.peak_rps
    if band is None:
        return Band.LOW if rate < low else Band.PEAK if rate > peak else Band.MIDDLE
    up, down = 1 + config.hysteresis, 1 - config.hysteresis
    if rate > peak * up:
        return Band.PEAK
    if rate < low * down:
        return Band.LOW
    if (band is Band.PEAK and rate < peak * down) or (band is Band.LOW and rate > low * up):
        return Band.MIDDLE
    return band
