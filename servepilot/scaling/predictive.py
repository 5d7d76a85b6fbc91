"""Scaling ahead of the cold start: forecast the arrivals, size the fleet for them, and never
fewer replicas than the step rules want."""

from __future__ import annotations

import math
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.scaling.forecast import HoltForecast
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.step import StepPolicy, StepRules, without_float_noise


@dataclass(frozen=True, slots=True)
class ForecastSizing:
    replica_rps: float
    """Requests per second one replica serves within the SLO: measured (`servepilot bench`
    or `sim` on one replica, `tune`) or planned."""
    horizon_s: float
    """How far ahead to size for: at least the cold start (a replica asked for now serves
    only then) plus a tick."""
    fill: float = 0.8
    """The share of `replica_rps` to plan each replica at (the step rules' upper line:
    what the forecast asks for, the rules would not scale up from)."""
    alpha: float = 0.1
    beta: float = 0.01

    def __post_init__(self) -> None:
        if self.replica_rps <= 0 or self.horizon_s <= 0 or not 0.0 < self.fill <= 1.0:
            raise ConfigError(
                "forecast sizing needs replica_rps > 0, horizon_s > 0 and fill in (0, 1]"
            )


class PredictivePolicy:
    """max(the step rules' answer, the replicas the forecast arrival rate needs).

    Every tick the seconds of arrivals it has not seen yet (the snapshot's
    `arrivals_per_s`) go into a `HoltForecast`; the fleet is sized for the highest forecast
    rate over the next `horizon_s`: ceil(rate / (fill x replica_rps)), within [min, max].
    The forecast only ever adds (and may add while replicas start: it already counts
    them); giving replicas back is the step rules' (their cool-down, removal check)."""

    name = "predictive"

    def __init__(self, sizing: ForecastSizing, rules: StepRules | None = None) -> None:
        self.sizing = sizing
        self.step = StepPolicy(rules)
        self.forecast = HoltForecast(sizing.alpha, sizing.beta)
        self._seen_second: int | None = None
        """The second that ended last in what was fed (floor of the last tick's time)."""

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        self._feed(snapshot.arrivals_per_s, now_s)
        rules = self.step.rules
        sizing = self.sizing
        rate = self.forecast.peak(sizing.horizon_s)
        need = rules.bounded(
            math.ceil(without_float_noise(rate / (sizing.fill * sizing.replica_rps)))
        )
        base = self.step.decide(snapshot, now_s)
        if need <= base.replicas:
            return base
        detail = (
            f"forecast {rate:.1f} req/s within {sizing.horizon_s:g} s needs {need} at "
            f"{sizing.fill:g} x {sizing.replica_rps:g} req/s (rules: {base.replicas})"
        )
        return ScaleDecision(need, ScaleReason.FORECAST, detail)

    def _feed(self, per_second: tuple[float, ...], now_s: float) -> None:
        second = int(now_s)
        last = self._seen_second
        new = len(per_second) if last is None else min(len(per_second), second - last)
        for value in per_second[len(per_second) - new :] if new > 0 else ():
            self.forecast.observe(value)
        self._seen_second = second
