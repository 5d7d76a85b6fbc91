"""Replicas for a target share of the concurrency budgets in use (like a Kubernetes HPA)."""

from __future__ import annotations

import math
from collections import deque

from servepilot.core.errors import ConfigError
from servepilot.scaling.flap import TooFewMemory
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.step import without_float_noise


class TargetUtilisation:
    """Replicas for a target share of the concurrency budgets in use, like a Kubernetes HPA
    on the gateway's in-flight plus queued requests.

    desired = ceil((in flight + queued) / (target x budget per replica)), within
    [min_replicas, max_replicas]. Scaling up acts at once; scaling down waits until the
    desire has stayed lower for `scale_down_window_s` (the HPA's stabilisation window), so a
    dip between bursts does not throw away replicas that took a cold start to get. While
    replicas start, it asks for more only in proportion to the arrivals' growth since its last
    step up (the queue that grows meanwhile is the capacity on its way, not more load), and
    it never scales down to a count that was too few for the load now (`scaling.flap`).
    """

    name = "target"

    def __init__(
        self,
        target: float = 0.7,
        min_replicas: int = 1,
        max_replicas: int = 1024,
        scale_down_window_s: float = 300.0,
    ) -> None:
        if not 0.0 < target <= 1.0:
            raise ConfigError(f"autoscale target must be in (0, 1], got {target}")
        if not 0 <= min_replicas <= max_replicas:
            raise ConfigError("autoscale needs 0 <= min_replicas <= max_replicas")
        if scale_down_window_s < 0:
            raise ConfigError("scale_down_window_s must be >= 0")
        self._target = target
        self._min = min_replicas
        self._max = max_replicas
        self._window_s = scale_down_window_s
        self._recent: deque[tuple[float, int]] = deque()
        self._budget = 1
        """A replica's concurrency budget, as last seen (kept while the fleet is at zero)."""
        self.too_few = TooFewMemory()
        """Counts that were too few for a load: not scaled down to while it lasts."""
        self._up_count = 0
        self._up_rate = 0.0
        """The count of the last step up, and the arrival rate it was asked at."""

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        if snapshot.replicas:
            self._budget = max(1, snapshot.replicas[0].budget)
        load = snapshot.in_flight + snapshot.queued
        wanted = min(self._max, max(self._min, math.ceil(load / (self._target * self._budget))))
        recent = self._recent
        recent.append((now_s, wanted))
        while recent and recent[0][0] < now_s - self._window_s:
            recent.popleft()
        # The highest desire of the window: down only once every recent look agreed.
        desired = max(w for _, w in recent)
        detail = f"{load} in flight + queued, {self._target:g} x {self._budget} per replica"
        have = snapshot.provisioned
        rate = _recent_rate(snapshot)
        if snapshot.starting and desired > have:
            # The queue grows while replicas start (the capacity asked for is not serving
            # yet): read as more load, it would ask again every tick of a cold start. Only
            # the arrivals' own growth since the last step up is: in proportion to it.
            grown = have
            if self._up_rate:
                grown = math.floor(without_float_noise(self._up_count * rate / self._up_rate))
            if grown < desired:
                desired = max(have, grown)
                recent.clear()
                recent.append((now_s, desired))
                detail = f"{detail}; {snapshot.starting} starting, at most {grown} for the arrivals"
                if desired == have:
                    decision = ScaleDecision(have, ScaleReason.STARTING, detail)
                    return self.too_few.steady(snapshot, decision)
        if desired > have:
            self._up_count, self._up_rate = desired, rate
        return self.too_few.steady(snapshot, ScaleDecision(desired, ScaleReason.TARGET, detail))


GROWTH_WINDOW_S = 15
"""The seconds of arrivals whose mean the growth during a cold start is read from."""


def _recent_rate(snapshot: FleetSnapshot) -> float:
    recent = snapshot.arrivals_per_s[-GROWTH_WINDOW_S:]
    return sum(recent) / len(recent) if recent else 0.0
