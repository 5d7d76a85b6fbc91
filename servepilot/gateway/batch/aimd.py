"""How many batch lines may be in flight: an AIMD window (pure, no I/O).

Additive increase, multiplicative decrease, as TCP does with a congested link: the window
halves when the fleet pushes back (a 429 or 5xx answer to a batch line, or interactive
requests queueing up at the gateway) and grows back by one after each window's worth of
successes. Until the first push-back it grows by one per success (doubling every window),
so an idle fleet fills in a few windows instead of hundreds. After a cut, the signals of the
lines already in flight (sent under the old window) are not counted again.
"""

from __future__ import annotations


class AimdWindow:
    """The batch concurrency limit, between `floor` and `ceiling`."""

    def __init__(self, ceiling: int, floor: int = 1, start: int = 1) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got {floor} and {ceiling}")
        self.ceiling = ceiling
        self.floor = floor
        self.limit = min(max(start, floor), ceiling)
        self.slow_start = True
        self._successes = 0
        self._grace = 0  # completions still to come from before the last cut
        self._queued = 0

    def on_success(self) -> None:
        self._grace = max(0, self._grace - 1)
        self._successes += 1
        if self.slow_start or self._successes >= self.limit:
            self.limit = min(self.ceiling, self.limit + 1)
            self._successes = 0

    def on_pushback(self) -> bool:
        """A 429/5xx answer; True when the window was cut (not already cut for it)."""
        if self._grace > 0:
            self._grace -= 1
            return False
        self.slow_start = False
        self._grace = self.limit  # the lines in flight went out under the old window
        self.limit = max(self.floor, self.limit // 2)
        self._successes = 0
        return True

    def on_interactive_queue(self, depth: int) -> bool:
        """The interactive (P0/P1) requests waiting at the gateway now; a rise is push-back
        (batch lines hold the slots they wait for). True when the window was cut."""
        grew = depth > self._queued
        self._queued = depth
        return grew and self.on_pushback()
