"""A cheap online forecast of the arrival rate: Holt's linear trend (double exponential
smoothing), one observation per second, a few float operations each."""

from __future__ import annotations

from servepilot.core.errors import ConfigError


class HoltForecast:
    """Level and trend of a series observed once per second.

        level_t = alpha x y_t + (1 - alpha) x (level_{t-1} + trend_{t-1})
        trend_t = beta x (level_t - level_{t-1}) + (1 - beta) x trend_{t-1}
        forecast(h) = level_t + h x trend_t

    On a linear ramp the forecast converges to the ramp itself (no lag once the trend is
    learnt); after a step change the level closes (1 - alpha)^t of the gap, less the
    overshoot the trend adds. Small `beta` keeps Poisson noise out of the trend, which a
    horizon of minutes multiplies."""

    def __init__(self, alpha: float = 0.1, beta: float = 0.01) -> None:
        if not (0.0 < alpha <= 1.0 and 0.0 <= beta <= 1.0):
            raise ConfigError("Holt's smoothing needs 0 < alpha <= 1 and 0 <= beta <= 1")
        self.alpha = alpha
        self.beta = beta
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
        new = self.alpha * value + (1.0 - self.alpha) * (level + self.trend)
        self.trend = self.beta * (new - level) + (1.0 - self.beta) * self.trend
        self.level = new

    def forecast(self, ahead_s: float) -> float:
        """The series `ahead_s` seconds after the last observation (0.0 before any), never
        below 0."""
        if self.level is None:
            return 0.0
        return max(0.0, self.level + ahead_s * self.trend)

    def peak(self, horizon_s: float) -> float:
        """The highest forecast over the next `horizon_s` (a line: one of its ends)."""
        return max(self.forecast(0.0), self.forecast(horizon_s))
