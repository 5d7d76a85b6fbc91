"""Headroom from the forecast's own errors: how far the arrivals came out above what was
forecast one horizon earlier, a high quantile of the last minutes of it. Bursty traffic, which
a forecast of past arrivals sees only once it has happened, earns a large headroom; smooth
traffic, which it follows, next to none: the errors' share that Poisson arrival noise alone
explains, which each replica's fill already covers, can be taken off."""

from __future__ import annotations

import bisect
import math
from collections import deque
from statistics import NormalDist

from servepilot.core.errors import ConfigError


class ForecastErrors:
    """The errors of forecasts made `horizon_s` ahead, once per second, and a quantile of them.

    Every second `record(value, forecast_ahead)` takes the second's arrivals and the forecast
    just made for `horizon_s` later. The error of a second is the arrivals' mean over the last
    `smooth_s` seconds (so that Poisson noise, which the fill of each replica already covers,
    stays out of it) less the forecast made `horizon_s` earlier for that second; `headroom`
    is the `quantile` of the last `window_s` errors, never below 0: forecasts too high earn
    nothing back.

    With `less_poisson_noise` the values are arrival counts per second, and `headroom` takes
    off what Poisson noise alone would put at that quantile: a `smooth_s` mean of arrivals at
    rate r has a standard deviation of sqrt(r / smooth_s), so z(quantile) x sqrt(r /
    smooth_s), r the mean rate over the window (normal approximation; z of 1 - 1/(n + 1) at
    quantile 1, where the nearest rank is the highest of n). Without it, a steady 100 req/s
    that the forecast follows exactly would still earn 1.645 x sqrt(100 / 15) = 4.2 req/s
    at the 95th percentile: noise that the fill of each replica covers already.

    With `fade` an error counts less with its age: x (1 - age / window_s), so that a one-off
    miss stops sizing the fleet gradually, not at once `window_s` later, while a miss that
    recurs is counted afresh each time.

    Bounded: three rings (horizon, window, smoothing) and the window's errors kept sorted (a
    bisect and a list shift per second, O(1) per `headroom`; with `fade`, a sort of the
    window's errors per `headroom`, since ageing changes their order)."""

    def __init__(
        self,
        horizon_s: float,
        window_s: int = 600,
        quantile: float = 0.95,
        smooth_s: int = 15,
        less_poisson_noise: bool = False,
        fade: bool = False,
    ) -> None:
        if horizon_s < 1 or window_s < 1 or smooth_s < 1 or not 0.0 < quantile <= 1.0:
            raise ConfigError(
                "forecast errors need horizon_s >= 1, window_s >= 1, smooth_s >= 1 and "
                "a quantile in (0, 1]"
            )
        self.horizon_s = round(horizon_s)
        self.quantile = quantile
        self._pending: deque[float] = deque()
        """Forecasts made in the last `horizon_s` seconds, oldest first."""
        self._errors: deque[float] = deque()
        self._ranked: list[float] = []
        """The same errors, sorted."""
        self.window_s = window_s
        self.fade = fade
        self._recent: deque[float] = deque(maxlen=smooth_s)
        self._recent_sum = 0.0
        self._means: deque[float] = deque()
        """The smoothed arrivals each error of the window was measured against."""
        self._means_sum = 0.0
        z_quantile = min(quantile, window_s / (window_s + 1.0))
        self._noise_per_sqrt_rps = (
            NormalDist().inv_cdf(z_quantile) / math.sqrt(smooth_s) if less_poisson_noise else 0.0
        )
        """The noise's quantile over the square root of the mean rate (0: not taken off)."""

    def record(self, value: float, forecast_ahead: float) -> None:
        recent = self._recent
        if len(recent) == recent.maxlen:
            self._recent_sum -= recent[0]
        recent.append(value)
        self._recent_sum += value
        pending = self._pending
        if len(pending) == self.horizon_s:
            self._add_error(self._recent_sum / len(recent), pending.popleft())
        pending.append(forecast_ahead)

    def _add_error(self, mean: float, forecast: float) -> None:
        errors, ranked, means = self._errors, self._ranked, self._means
        if len(errors) == self.window_s:
            del ranked[bisect.bisect_left(ranked, errors.popleft())]
            self._means_sum -= means.popleft()
        error = mean - forecast
        errors.append(error)
        bisect.insort(ranked, error)
        means.append(mean)
        self._means_sum += mean

    @property
    def errors(self) -> int:
        """Errors in the window (0 until a first horizon has passed)."""
        return len(self._errors)

    def noise(self) -> float:
        """What Poisson noise alone puts at the `quantile` of the window's errors (req/s);
        0 without `less_poisson_noise` or errors."""
        if not self._means:
            return 0.0
        mean_rps = max(0.0, self._means_sum / len(self._means))
        return self._noise_per_sqrt_rps * math.sqrt(mean_rps)

    def headroom(self) -> float:
        """The `quantile` of the window's errors (nearest rank; faded with `fade`) less
        `noise()`, at least 0; 0 with none."""
        ranked = self._faded() if self.fade else self._ranked
        if not ranked:
            return 0.0
        at = max(0, math.ceil(round(self.quantile * len(ranked), 9)) - 1)
        return max(0.0, ranked[at] - self.noise())

    def _faded(self) -> list[float]:
        """The window's errors, each x (1 - age / window_s) (the newest is 0 s old), sorted."""
        errors = self._errors
        newest = len(errors) - 1
        window_s = self.window_s
        return sorted(e * (1.0 - (newest - i) / window_s) for i, e in enumerate(errors))
