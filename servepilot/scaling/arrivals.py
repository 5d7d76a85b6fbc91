"""The gateway's arrivals per whole second, the last few minutes of them: what a forecast
reads. Bounded (a ring of `capacity_s` counts), O(1) per arrival."""

from __future__ import annotations

from collections import deque

from servepilot.core.errors import ConfigError


class ArrivalHistory:
    """Requests that reached the gateway in each whole second, the last `capacity_s` of them.

    `add` counts an arrival in the second it falls in; a second is closed (and shows in
    `per_second`) once time has passed its end. Seconds without arrivals count 0."""

    def __init__(self, capacity_s: int = 600) -> None:
        if capacity_s < 1:
            raise ConfigError(f"the arrival history needs at least 1 s, got {capacity_s}")
        self.capacity_s = capacity_s
        self._closed: deque[int] = deque(maxlen=capacity_s)
        self._second = 0
        """The second being counted (floor of its start time)."""
        self._count = 0

    def add(self, now_s: float, count: int = 1) -> None:
        second = int(now_s)
        if second != self._second:
            self._roll(second)
        self._count += count

    def per_second(self, now_s: float) -> tuple[float, ...]:
        """The closed seconds' counts, oldest first; the last one ended at floor(now_s)."""
        second = int(now_s)
        if second > self._second:
            self._roll(second)
        return tuple(float(c) for c in self._closed)

    def _roll(self, second: int) -> None:
        if second < self._second:
            return  # time never goes back; a late arrival counts in the open second
        closed = self._closed
        closed.append(self._count)
        # Whole seconds without arrivals in between; more than the ring holds would only
        # push zeros through it.
        for _ in range(min(second - self._second - 1, self.capacity_s)):
            closed.append(0)
        self._second = second
        self._count = 0
