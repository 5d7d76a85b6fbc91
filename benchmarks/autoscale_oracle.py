"""A clairvoyant reference for `bench_autoscale.py`: a policy that is told the trace's rate
function, so it knows the future exactly, and sizes the fleet for it a cold start ahead.

Not a product policy (no real fleet knows its future); it implements the same
`decide(snapshot, now_s) -> ScaleDecision` interface so that the simulator runs it on the same
fleet with the same arrivals as the others. What it measures: the fewest replica-hours any
policy can reach with this cold start, this tick and this fill of each replica, and the
attainment that buys. A target that it misses is a property of the trace, not of a policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from servepilot.core.errors import ConfigError
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.step import without_float_noise


class ClairvoyantPolicy:
    """Every tick: ceil(highest rate over [now, now + horizon_s] / capacity_rps), within
    [min, max]; replicas are given back as soon as that allows (no hysteresis: it knows
    what comes).

    `horizon_s` is the cold start plus a tick: a replica needed at time u must be asked for
    by the last tick before u - cold start, at most a cold start and a tick earlier. The
    highest rate over the window is read on a `grid_s` grid and at its end (exact for a
    rate that is constant between grid points; within slope x grid_s otherwise). The
    snapshot is not read: the rate function is all it needs."""

    name = "oracle"

    def __init__(
        self,
        rate: Callable[[float], float],
        horizon_s: float,
        capacity_rps: float,
        min_replicas: int,
        max_replicas: int,
        grid_s: float = 1.0,
    ) -> None:
        bounds_ok = 0 < min_replicas <= max_replicas
        if horizon_s < 0 or capacity_rps <= 0 or grid_s <= 0 or not bounds_ok:
            raise ConfigError(
                "the clairvoyant reference needs horizon_s >= 0, capacity_rps > 0, grid_s > 0 "
                "and 0 < min_replicas <= max_replicas"
            )
        self.rate = rate
        self.horizon_s = horizon_s
        self.capacity_rps = capacity_rps
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.grid_s = grid_s

    def peak_rps(self, now_s: float) -> float:
        """The highest rate over [now_s, now_s + horizon_s]."""
        steps = int(self.horizon_s / self.grid_s)
        points = [now_s + k * self.grid_s for k in range(steps + 1)]
        return max(self.rate(t) for t in [*points, now_s + self.horizon_s])

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        peak = self.peak_rps(now_s)
        need = math.ceil(without_float_noise(peak / self.capacity_rps))
        want = min(self.max_replicas, max(self.min_replicas, need))
        reason = ScaleReason.FORECAST if want == need else ScaleReason.BOUNDS
        detail = (
            f"known peak {peak:.1f} req/s within {self.horizon_s:g} s needs {need} at "
            f"{self.capacity_rps:g} req/s a replica"
        )
        return ScaleDecision(want, reason, detail)
