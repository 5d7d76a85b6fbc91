"""A cheap online forecast of the arrival rate: Holt's trend (double exponential smoothing),
damped or not, one observation per second, a few float operations each."""

from __future__ import annotations

import math

from servepilot.core.errors import ConfigError


class HoltForecast:
    """Level and trend of a series observed once per second.

        level_t = alpha x y_t + (1 - alpha) x (level_{t-1} + phi x trend_{t-1})
        trend_t = beta x (level_t - level_{t-1}) + (1 - beta) x phi x trend_{t-1}
        forecast(h) = level_t + (phi + phi^2 + ... + phi^h) x trend_t

    With `damping` phi = 1 (Holt's linear trend) the forecast on a linear ramp converges to
    the ramp itself (no lag once the trend is learnt); after a step change the level closes
    (1 - alpha)^t of the gap, less the overshoot the trend adds. Small `beta` keeps Poisson
    noise out of the trend, which a horizon of minutes multiplies. phi < 1 (Gardner and
    McKenzie's damped trend) bends the line towards a level: no further than
    trend x phi / (1 - phi) however far ahead, so a trend learnt from the steep edge of a
    burst, or from noise, is not carried a whole cold start ahead at full slope."""

    def __init__(self, alpha: float = 0.1, beta: float = 0.01, damping: float = 1.0) -> None:
        if not (0.0 < alpha <= 1.0 and 0.0 <= beta <= 1.0 and 0.0 < damping <= 1.0):
            raise ConfigError(
                "Holt's smoothing needs 0 < alpha <= 1, 0 <= beta <= 1 and 0 < damping <= 1"
            )
        self.alpha = alpha
        self.beta = beta
        self.damping = damping
        self.level: float | None = None
        """None until the first observation."""
        self.trend = 0.0
        self.observed = 0

    def observe(self, value: float) -> None:
        self.observed += 1
        level = self.level
        if level is None:
            self.level = value
            return
        trend = self.damping * self.trend
        new = self.alpha * value + (1.0 - self.alpha) * (level + trend)
        self.trend = self.beta * (new - level) + (1.0 - self.beta) * trend
        self.level = new

    def forecast(self, ahead_s: float) -> float:
        """The series `ahead_s` seconds after the last observation (0.0 before any), never
        below 0."""
        if self.level is None:
            return 0.0
        return max(0.0, self.level + self.trend_steps(ahead_s) * self.trend)

    def trend_steps(self, ahead_s: float) -> float:
        """How many trends the forecast `ahead_s` ahead adds: `ahead_s` undamped, else the
        geometric sum phi + ... + phi^h (continuous in h)."""
        phi = self.damping
        if phi == 1.0:
            return ahead_s
        return phi * (1.0 - math.pow(phi, ahead_s)) / (1.0 - phi)

    def peak(self, horizon_s: float) -> float:
        """The highest forecast over the next `horizon_s` (monotonic in h: one of its ends)."""
        return max(self.forecast(0.0), self.forecast(horizon_s))
