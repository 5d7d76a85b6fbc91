"""The clairvoyant reference (`sim --scaling-policy oracle`, `make bench-autoscale`): a policy
told the trace's future rate, which sizes the fleet for it a cold start (or a wake) ahead.

No real fleet knows its future, so fleet.yaml cannot name it; the simulator can, because it
holds the level's whole schedule before the run. It implements the same `decide(snapshot,
now_s) -> ScaleDecision` as the others, so it runs on the same fleet with the same arrivals.
What it measures: the fewest replica-hours any policy can reach with this cold start, this
tick and this fill of each replica, and the attainment that buys. A target that it misses is
a property of the trace, not of a policy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.step import without_float_noise

RATE_WINDOW_S = 30.0
"""The window a schedule's rate is counted over (centred): long enough that Poisson noise
moves it by a few percent at tens of requests a second, short enough to follow a ramp."""


class ClairvoyantPolicy:
    """Every tick: ceil(highest rate over [now, now + horizon_s] / capacity_rps), within
    [min, max]; replicas are given back as soon as that allows (no hysteresis: it knows
    what comes).

    `horizon_s` is the cold start plus a tick: a replica needed at time u must be asked for
    by the last tick before u - cold start, at most a cold start and a tick earlier. With a
    warm pool of `pool` sleeping replicas, woken in `wake_horizon_s` less a tick, it asks for
    max(need over the wake horizon, need over the cold horizon - pool): the pool gives the
    rest in time, and only what it cannot is started cold ahead. The
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
        pool: int = 0,
        wake_horizon_s: float | None = None,
    ) -> None:
        bounds_ok = 0 <= min_replicas <= max_replicas and max_replicas >= 1
        wake_s = horizon_s if wake_horizon_s is None else wake_horizon_s
        if horizon_s < 0 or capacity_rps <= 0 or grid_s <= 0 or not bounds_ok or pool < 0:
            raise ConfigError(
                "the clairvoyant reference needs horizon_s >= 0, capacity_rps > 0, grid_s > 0 "
                "0 <= min_replicas <= max_replicas, max_replicas >= 1 and pool >= 0"
            )
        if not 0 <= wake_s <= horizon_s:
            raise ConfigError("the wake horizon must be within [0, the cold horizon]")
        self.rate = rate
        self.horizon_s = horizon_s
        self.capacity_rps = capacity_rps
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.grid_s = grid_s
        self.pool = pool
        self.wake_horizon_s = wake_s

    def peak_rps(self, now_s: float, horizon_s: float | None = None) -> float:
        """The highest rate over [now_s, now_s + horizon_s] (default: the cold horizon)."""
        horizon_s = self.horizon_s if horizon_s is None else horizon_s
        steps = int(horizon_s / self.grid_s)
        points = [now_s + k * self.grid_s for k in range(steps + 1)]
        return max(self.rate(t) for t in [*points, now_s + horizon_s])

    def _need(self, peak_rps: float) -> int:
        return math.ceil(without_float_noise(peak_rps / self.capacity_rps))

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        peak = self.peak_rps(now_s)
        need = self._need(peak)
        detail = (
            f"known peak {peak:.1f} req/s within {self.horizon_s:g} s needs {need} at "
            f"{self.capacity_rps:g} req/s a replica"
        )
        if self.pool:
            soon = self._need(self.peak_rps(now_s, self.wake_horizon_s))
            need = max(soon, need - self.pool)
            detail += f"; {soon} within {self.wake_horizon_s:g} s, the pool of {self.pool} the rest"
        want = min(self.max_replicas, max(self.min_replicas, need))
        reason = ScaleReason.FORECAST if want == need else ScaleReason.BOUNDS
        return ScaleDecision(want, reason, detail)


def schedule_rate(
    sends_s: Sequence[float], window_s: float = RATE_WINDOW_S
) -> Callable[[float], float]:
    """The rate of a known schedule of sends (sorted times, s): at t, the sends within
    [t - window_s / 2, t + window_s / 2) over window_s."""
    if window_s <= 0:
        raise ConfigError(f"the rate window must be > 0 s, got {window_s}")
    times = list(sends_s)
    half = window_s / 2

    def rate(t: float) -> float:
        count = bisect.bisect_left(times, t + half) - bisect.bisect_left(times, t - half)
        return count / window_s

    return rate


@dataclass(frozen=True, slots=True)
class OracleSetup:
    """What the simulator builds the oracle from, before the level's schedule is known."""

    min_replicas: int
    max_replicas: int
    replica_rps: float
    """Requests per second one replica serves within the SLO (as `predictive`'s)."""
    horizon_s: float
    """The cold start plus a tick."""
    fill: float = 0.8
    pool: int = 0
    """Sleeping replicas behind the serving ones (the fleet's warm pool)."""
    wake_horizon_s: float | None = None
    """With a pool: the wake plus a tick."""
    """The share of replica_rps each replica is planned at (`predictive`'s default)."""

    def __post_init__(self) -> None:
        if self.replica_rps <= 0 or not 0.0 < self.fill <= 1.0:
            raise ConfigError(
                "the oracle needs the requests per second one replica serves within the SLO "
                "(sim's --replica-rps) and a fill in (0, 1]",
                hint="simulate one replica: servepilot sim --replicas 1 --sweep (the sweet spot)",
            )

    def describe(self) -> dict[str, object]:
        return {
            "policy": "oracle",
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "replica_rps": self.replica_rps,
            "fill": self.fill,
            "horizon_s": self.horizon_s,
        } | ({"pool": self.pool, "wake_horizon_s": self.wake_horizon_s} if self.pool else {})

    def build(self, sends_s: Sequence[float]) -> ClairvoyantPolicy:
        """The oracle told the level's schedule (its sends, sorted, s)."""
        return ClairvoyantPolicy(schedule_rate(sends_s), self.horizon_s,
                                 self.fill * self.replica_rps, self.min_replicas,
                                 self.max_replicas, pool=self.pool,
                                 wake_horizon_s=self.wake_horizon_s)  # fmt: skip
