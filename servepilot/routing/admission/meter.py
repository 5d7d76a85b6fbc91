"""An event rate (e.g. dispatches per second) averaged exponentially over time, fed timestamps."""

from __future__ import annotations

import math

from mypy_extensions import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True)
class RateMeter:
    """Events per second over roughly the last `tau_s` seconds, older events fading out.

    The decayed event count is divided by the decayed length of the observed span, not by
    `tau_s`, so the estimate is unbiased from the start instead of creeping up from 0 during
    the first `tau_s` (which would make queue-wait predictions too pessimistic right when a
    queue first forms). The first event only marks the start of the measurement: a rate needs
    two events, and `rate_per_s` reads 0.0 ("not measured") until then.
    """

    def __init__(self, tau_s: float = 10.0) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be > 0")
        self._tau_s = tau_s
        self._start_s: float | None = None
        self._last_s = 0.0
        self._weight = 0.0
        """Decayed count of the events after the first, as of `_last_s`."""

    def record(self, now_s: float) -> None:
        """One event happened at `now_s`."""
        if self._start_s is None:
            self._start_s = self._last_s = now_s
            return
        last_s = self._last_s
        if now_s < last_s:
            now_s = last_s
        # _decay, inlined (a gateway records every dispatch).
        self._weight = self._weight * math.exp(-(now_s - last_s) / self._tau_s) + 1.0
        self._last_s = now_s

    def rate_per_s(self, now_s: float) -> float:
        """The estimated rate at `now_s`; 0.0 while fewer than two events were seen."""
        if self._start_s is None:
            return 0.0
        last_s = self._last_s
        if now_s < last_s:
            now_s = last_s
        span_s = now_s - self._start_s
        if span_s <= 0 or self._weight == 0.0:
            return 0.0
        tau_s = self._tau_s
        weight = self._weight * math.exp(-(now_s - last_s) / tau_s)  # _decay, inlined
        window_s = -tau_s * math.expm1(-span_s / tau_s)
        return weight / window_s

    def _decay(self, elapsed_s: float) -> float:
        return math.exp(-elapsed_s / self._tau_s)
