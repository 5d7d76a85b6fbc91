"""The seeds' step rules: +10% of the replicas above 80% utilisation, -5% below 50%."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from servepilot.core.errors import ConfigError
from servepilot.scaling.flap import TooFewMemory
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.utilisation import PeakWindow, UtilisationLimits, fleet_utilisation


@dataclass(frozen=True, slots=True)
class StepRules:
    """Seed 003's rules and bounds (min 2, max 20), with cool-downs between steps."""

    min_replicas: int = 2
    max_replicas: int = 20
    upper: float = 0.8
    """Above this peak utilisation: a step up."""
    lower: float = 0.5
    """Below this peak utilisation: a step down, if the removal check passes."""
    up_share: float = 0.10
    down_share: float = 0.05
    up_cooldown_s: float = 30.0
    """From the fleet's last change to the next step up. Short: the freeze while replicas
    start already holds the next step for a cold start; this only lets the minute's peak
    see the replicas that joined."""
    down_cooldown_s: float = 60.0
    """From the fleet's last change to the next step down. One replica a minute at most (at
    up to 39 replicas): a fleet of 20 halves in about 10 minutes. Flapping is kept off by
    the gap between the lines, the minute's peak and the removal check. With 300 s (the
    HPA's window) halving 20 replicas takes 50 minutes (docs/benchmarks.md: bench-autoscale
    measured both)."""
    window_s: float = 60.0
    """The utilisation compared with the lines is its peak over this window."""
    limits: UtilisationLimits = field(default_factory=UtilisationLimits)

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ConfigError("autoscale needs 0 <= min_replicas <= max_replicas, max >= 1")
        if not 0.0 < self.lower < self.upper:
            raise ConfigError("the step rules need 0 < lower < upper")
        if self.up_share <= 0 or self.down_share <= 0:
            raise ConfigError("the step shares must be > 0")
        if self.up_cooldown_s < 0 or self.down_cooldown_s < 0:
            raise ConfigError("cool-downs must be >= 0")

    def step_up(self, replicas: int) -> int:
        """Replicas a step up adds: up_share of them rounded up, at least one (10% of 3 is
        one replica, 10% of 11 two)."""
        return max(1, math.ceil(without_float_noise(self.up_share * replicas)))

    def step_down(self, replicas: int) -> int:
        """Replicas a step down removes: down_share of them rounded down, at least one (5% of
        20 is one replica, 5% of 39 one, 5% of 40 two)."""
        return max(1, math.floor(without_float_noise(self.down_share * replicas)))

    def bounded(self, replicas: int) -> int:
        return min(self.max_replicas, max(self.min_replicas, replicas))


def without_float_noise(value: float) -> float:
    """`value` without the binary rounding that would make ceil(0.07 x 100) 8 instead of 7."""
    return round(value, 9)


class StepPolicy:
    """The seeds' step rules on the fleet's peak utilisation over the last minute
    (`scaling.utilisation`), in this order:

    1. outside [min, max]: back inside at once;
    2. replicas still starting: no step (their capacity is not in the utilisation yet);
    3. peak above `upper`: add `step_up` replicas, once `up_cooldown_s` has passed since
       the fleet last changed;
    4. peak below `lower`: remove `step_down` replicas, once `down_cooldown_s` has passed,
       and only if the ready replicas left would stay under `upper` with the load of the
       removed ones (peak x ready / (ready - removed) < upper), checked before removing;
    5. else hold;
    6. a step down never leaves a count that had to be left upward at this load before
       (`scaling.flap`: no oscillation on a flat load).

    "The fleet last changed" is this policy's own last step, or any change of the
    provisioned count it did not ask for (a larger forecast taken over its answer)."""

    name = "step"

    def __init__(self, rules: StepRules | None = None) -> None:
        self.rules = rules or StepRules()
        self._peak = PeakWindow(self.rules.window_s)
        self.peak = 0.0
        """The peak utilisation the last decision compared with the lines."""
        self._changed_s = -math.inf
        self._expected: int | None = None
        """The provisioned count after the last decision; another one means a change."""
        self.too_few = TooFewMemory()
        """Counts that were too few for a load: not stepped down to while it lasts."""

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        have = snapshot.provisioned
        if self._expected is not None and have != self._expected:
            self._changed_s = now_s
        peak = self.peak = self._peak.add(now_s, fleet_utilisation(snapshot, self.rules.limits))
        decision = self.too_few.steady(snapshot, self._rules(snapshot, have, peak, now_s))
        if decision.replicas != have:
            self._changed_s = now_s
        self._expected = decision.replicas
        return decision

    def _rules(
        self, snapshot: FleetSnapshot, have: int, peak: float, now_s: float
    ) -> ScaleDecision:
        rules = self.rules
        seen = f"peak utilisation {peak:.2f} over {rules.window_s:g} s, {have} replicas"
        if rules.bounded(have) != have:
            bounds = f"[{rules.min_replicas}, {rules.max_replicas}]"
            return ScaleDecision(
                rules.bounded(have), ScaleReason.BOUNDS, f"{have} outside {bounds}"
            )
        if snapshot.starting:
            return ScaleDecision(have, ScaleReason.STARTING, f"{snapshot.starting} still starting")
        since_s = now_s - self._changed_s
        if peak > rules.upper:
            want = rules.bounded(have + rules.step_up(have))
            if want == have:
                return ScaleDecision(have, ScaleReason.BOUNDS, f"{seen}; at max")
            if since_s < rules.up_cooldown_s:
                return _cooling(have, seen, since_s)
            return ScaleDecision(want, ScaleReason.UP, f"{seen} > {rules.upper:g}")
        if peak < rules.lower:
            return self._down(snapshot, have, peak, since_s, seen)
        return ScaleDecision(have, ScaleReason.HOLD, seen)

    def _down(
        self, snapshot: FleetSnapshot, have: int, peak: float, since_s: float, seen: str
    ) -> ScaleDecision:
        rules = self.rules
        want = rules.bounded(have - rules.step_down(have))
        if want == have:
            return ScaleDecision(have, ScaleReason.BOUNDS, f"{seen}; at min")
        if since_s < rules.down_cooldown_s:
            return _cooling(have, seen, since_s)
        ready = snapshot.ready
        left = ready - (have - want)
        after = peak * ready / left if left > 0 else math.inf
        if after >= rules.upper:
            return ScaleDecision(
                have, ScaleReason.REMOVAL_CHECK, f"{seen}; {after:.2f} on the {max(0, left)} left"
            )
        return ScaleDecision(want, ScaleReason.DOWN, f"{seen} < {rules.lower:g}; {after:.2f} after")

    def load_floor(self, snapshot: FleetSnapshot) -> int:
        """The fewest replicas the removal check lets the fleet shrink to at once: the ready
        ones left must stay under `upper` with the load of every ready one now at the last
        peak (peak x ready / left < upper). Replicas still starting carry no load: they go
        first."""
        ready = snapshot.ready
        if not ready:
            return 0
        over = without_float_noise(self.peak * ready / self.rules.upper)
        return min(ready, math.floor(over) + 1)


def _cooling(have: int, seen: str, since_s: float) -> ScaleDecision:
    return ScaleDecision(have, ScaleReason.COOL_DOWN, f"{seen}; last change {since_s:.0f} s ago")
