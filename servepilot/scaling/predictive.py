"""Scaling ahead of the cold start: forecast the arrivals, size the fleet for them plus the
headroom the forecast's own errors call for, never fewer replicas than the step rules add on
real load, and give replicas back as soon as the forecast allows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.scaling.flap import TooFewMemory
from servepilot.scaling.forecast import HoltForecast
from servepilot.scaling.headroom import ForecastErrors
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.step import StepPolicy, StepRules, without_float_noise
from servepilot.scaling.utilisation import PeakWindow


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
    what the forecast asks for, the rules would not scale up from). Kept with the error
    headroom on: 0.9 and 1.0 were measured to lower attainment on the bursts and below
    99.9% on a ramp (docs/benchmarks.md, `make bench-autoscale`)."""
    alpha: float = 0.1
    beta: float = 0.01
    damping: float = 1.0
    """Holt's trend damping per second (1: a straight line)."""
    error_quantile: float | None = 0.95
    """The headroom: this quantile of the forecast's errors over `error_window_s`, less what
    Poisson arrival noise alone puts there (the fill covers that); None: no headroom."""
    error_window_s: int = 600
    error_fade: bool = True
    """Each error counts x (1 - age / error_window_s) (`ForecastErrors`' `fade`): a one-off
    miss, such as a ramp's onset, stops sizing the fleet gradually instead of for the whole
    window. Measured against the plain window and shorter ones (300 s, 420 s) on all six
    traces of `make bench-autoscale`: fewer replica-hours on every one, attainment unchanged
    (docs/benchmarks.md); shorter windows cost more."""
    headroom_less_noise: bool = True
    """Take the Poisson noise's own quantile off the headroom (False: the raw quantile)."""
    hold_s: float | None = None
    """How long the forecast's need must have stayed lower before replicas are given back
    (hysteresis: a dip shorter than this gives nothing back); None: the step rules' down
    cool-down, the same pause their own step down keeps."""
    pool: int = 0
    """Sleeping replicas behind the fleet (a warm pool): replicas the forecast needs beyond
    `wake_horizon_s` are started cold only past what the pool can wake in time."""
    wake_horizon_s: float | None = None
    """With a pool: the wake plus a tick (what the pool's replicas need of warning)."""
    burst_window_s: int | None = 5
    """With a pool: the last seconds of arrivals read for a burst the forecast has not caught
    up with (Holt's level closes a tenth of a step's gap a second). Where their mean rate is
    above the forecast's level by more than `burst_sigmas` Poisson standard deviations, the
    pool wakes replicas for that rate at once (a wake is seconds, a cold start a minute: only
    the pool can answer a burst's first seconds). None: the forecast alone. Chosen on the
    shipped traces of `make bench-autoscale` (windows of 3, 5 and 10 s, 2 and 3 sigmas):
    5 s, 3 sigmas was the one that kept the bursts at 100.00% without costing the smooth
    traces a replica-hour (docs/benchmarks.md)."""
    burst_sigmas: float = 3.0
    wake_confirm_s: float = 4.0
    """With a pool: the forecast's need within the wake horizon wakes replicas only once it
    has stood this long (the lowest of its last `wake_confirm_s`); the burst rule, a
    statistical test of its own, wakes at once. Behind a pool the controller decides every
    second, five times as often as every 5 s, and so reads the forecast level's Poisson noise
    five times as often: at a flat 25 req/s the level crossed a replica's line on noise
    alone, and each wake was then held for `hold_s`. Chosen on the shipped traces of `make
    bench-autoscale` (0, 2, 3, 4 and 5 s): 3 and 4 s kept all three at 100%, 2 and 5 s lost
    requests on the ramp, 4 s saved the most (docs/benchmarks.md); 0: no wait."""
    fall_release: float | None = 1.0
    """Skip the hold when the forecast itself falls over the horizon by at least this many
    replicas' worth (fill x replica_rps; 0: any fall): a fall the trend carries is not the
    dip the hold is there for (Holt's trend noise over a cold start is about 2 req/s at
    125 req/s, a third of a replica's 6.8). None: always hold. Measured on all six traces of
    `make bench-autoscale`: 1 gives fewer replica-hours on all four smooth traces at 100%,
    the bursts' attainment unchanged; 0 lowers it by 3 to 6 points (docs/benchmarks.md)."""

    @property
    def error_horizon_s(self) -> float:
        """The horizon the headroom's errors are measured over: the one replicas asked for
        need (the wake's with a pool)."""
        if self.pool and self.wake_horizon_s is not None:
            return self.wake_horizon_s
        return self.horizon_s

    def __post_init__(self) -> None:
        if self.replica_rps <= 0 or self.horizon_s <= 0 or not 0.0 < self.fill <= 1.0:
            raise ConfigError(
                "forecast sizing needs replica_rps > 0, horizon_s > 0 and fill in (0, 1]"
            )
        wake = self.wake_horizon_s
        if self.pool < 0 or (wake is not None and not 0 < wake <= self.horizon_s):
            raise ConfigError("forecast sizing needs pool >= 0 and wake horizon in (0, horizon]")
        if self.burst_window_s is not None and (
            self.burst_window_s < 1 or not self.burst_sigmas >= 0
        ):
            raise ConfigError("burst_window_s must be >= 1 second and burst_sigmas >= 0")
        if not self.wake_confirm_s >= 0:
            raise ConfigError(f"wake_confirm_s must be >= 0 s, got {self.wake_confirm_s}")
        if self.fall_release is not None and self.fall_release < 0:
            raise ConfigError(f"fall_release must be >= 0 replicas, got {self.fall_release}")


class PredictivePolicy:
    """The replicas the forecast needs, never fewer than the step rules add on real load.

    Every tick the seconds of arrivals it has not seen yet (the snapshot's
    `arrivals_per_s`) go into a `HoltForecast`, and the errors of its forecasts one horizon
    back into `ForecastErrors` (faded with their age). The forecast's need is

        ceil((highest forecast rate over the next horizon_s + error headroom)
             / (fill x replica_rps)), within [min, max],

    and the policy answers the highest need of the last `hold_s` (hysteresis: a dip
    shorter than that gives nothing back), or the need now when the forecast itself falls
    by `fall_release` replicas' worth or more over the horizon (a trend, not a dip). Up:
    the more of that and the step rules' step (utilisation above the upper line is load
    already here). Down: to that need at once, however many replicas it is, but never below
    the removal check's floor (the ready replicas left stay under the upper line with
    today's load, `StepPolicy.load_floor`); the step rules' own step down does not go below
    the forecast's need; nor below a count that had to be left upward at this load before
    (`scaling.flap`)."""

    name = "predictive"

    def __init__(self, sizing: ForecastSizing, rules: StepRules | None = None) -> None:
        self.sizing = sizing
        self.step = StepPolicy(rules)
        self.forecast = HoltForecast(sizing.alpha, sizing.beta, sizing.damping)
        self.errors = (
            ForecastErrors(
                max(1.0, sizing.error_horizon_s),
                sizing.error_window_s,
                sizing.error_quantile,
                less_poisson_noise=sizing.headroom_less_noise,
                fade=sizing.error_fade,
            )
            if sizing.error_quantile is not None
            else None
        )
        self.hold_s = self.step.rules.down_cooldown_s if sizing.hold_s is None else sizing.hold_s
        self._needs = PeakWindow(self.hold_s)
        self._wake_needs = PeakWindow(sizing.wake_confirm_s)
        """The forecast's wake needs, negated: its peak is the lowest of the confirm window."""
        self._seen_second: int | None = None
        """The second that ended last in what was fed (floor of the last tick's time)."""
        self.too_few = TooFewMemory()
        """Counts that were too few for a load: not given back to while it lasts."""

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        decision = self._decide(snapshot, now_s)
        if self.falling():
            # A fall the forecast's trend carries is not the noise the memory is for.
            self.too_few.note(snapshot, decision.replicas)
            return decision
        return self.too_few.steady(snapshot, decision)

    def _decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        self._feed(snapshot.arrivals_per_s, now_s)
        rules = self.step.rules
        sizing = self.sizing
        rate = self.forecast.peak(sizing.horizon_s)
        headroom = self.errors.headroom() if self.errors is not None else 0.0
        need_now = rules.bounded(self._need(rate + headroom))
        if sizing.pool and sizing.wake_horizon_s is not None:
            # The pool wakes its replicas within the wake horizon (the headroom is the
            # errors over it): only the need beyond the pool is started a cold start ahead.
            soon = self._need(self.forecast.peak(sizing.wake_horizon_s) + headroom)
            soon = -round(self._wake_needs.add(now_s, -soon))
            soon = max(soon, self._need(self._burst_rps(snapshot.arrivals_per_s)))
            need_now = rules.bounded(max(soon, self._need(rate) - sizing.pool))
        if self.falling():
            self._needs.clear()
        need = round(self._needs.add(now_s, need_now))
        base = self.step.decide(snapshot, now_s)
        have = snapshot.provisioned
        if base.replicas > have or base.reason is ScaleReason.BOUNDS:
            if base.replicas > have:
                # The step up is load already here: held as a need, or the next tick's
                # forecast (which has not seen it yet) gives it back at once, and the
                # tick after steps up again.
                need = round(self._needs.add(now_s, base.replicas))
            if need <= base.replicas or base.replicas < have:
                return base
            want = need
        else:
            want = max(need, rules.bounded(self.step.load_floor(snapshot)))
            if want == base.replicas:
                return base
        detail = (
            f"forecast {rate:.1f} + {headroom:.1f} req/s error headroom within "
            f"{sizing.horizon_s:g} s needs {need_now} at {sizing.fill:g} x "
            f"{sizing.replica_rps:g} req/s, {need} at most over {self.hold_s:g} s "
            f"(rules: {base.replicas})"
        )
        return ScaleDecision(want, ScaleReason.FORECAST, detail)

    def _burst_rps(self, per_second: tuple[float, ...]) -> float:
        """The last `burst_window_s` seconds' mean rate where it stands above the forecast's
        level by more than Poisson noise would put it (`burst_sigmas`); else 0."""
        window = self.sizing.burst_window_s
        recent = per_second[-window:] if window else ()
        if not recent:
            return 0.0
        mean = sum(recent) / len(recent)
        level = self.forecast.forecast(0.0)
        noise = math.sqrt(max(level, 1.0) / len(recent))
        return mean if mean > level + self.sizing.burst_sigmas * noise else 0.0

    def _need(self, rate_rps: float) -> int:
        sizing = self.sizing
        return math.ceil(without_float_noise(rate_rps / (sizing.fill * sizing.replica_rps)))

    def falling(self) -> bool:
        """Whether the forecast falls over the horizon by more than `fall_release` replicas'
        worth."""
        sizing = self.sizing
        if sizing.fall_release is None:
            return False
        fall_rps = self.forecast.forecast(0.0) - self.forecast.forecast(sizing.horizon_s)
        return fall_rps > 0 and fall_rps >= sizing.fall_release * sizing.fill * sizing.replica_rps

    def _feed(self, per_second: tuple[float, ...], now_s: float) -> None:
        second = int(now_s)
        last = self._seen_second
        new = len(per_second) if last is None else min(len(per_second), second - last)
        horizon_s = self.sizing.error_horizon_s
        for value in per_second[len(per_second) - new :] if new > 0 else ():
            self.forecast.observe(value)
            if self.errors is not None:
                self.errors.record(value, self.forecast.forecast(horizon_s))
        self._seen_second = second
