"""fleet.yaml's `autoscale` section: how `up` scales its fleet, and the names of the policies
(`scaling/` implements them; the names live here, as the routing policies' do, so the config
can be validated without importing the policies)."""

from __future__ import annotations

import enum

from pydantic import Field, model_validator

from servepilot.core.config.adaptive_budget import AdaptiveBudgetConfig
from servepilot.core.config.section import Section as _Section
from servepilot.core.errors import ConfigError


class ScalingPolicyName(enum.Enum):
    STEP = "step"
    """The seeds' step rules (`scaling.step`)."""
    PREDICTIVE = "predictive"
    """A forecast of the arrivals ahead of the cold start (plus its own error), never below
    `step`'s step up."""
    TARGET = "target"
    """The HPA-like share of the concurrency budgets (`scaling.target_utilisation`)."""


def parse_bounds(text: str, flag: str = "--autoscale") -> tuple[int, int]:
    """`MIN:MAX` as typed after `flag` -> (min, max), 0 <= min <= max, max >= 1."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = -1
    if not sep or not 0 <= lo <= hi or hi < 1:
        raise ConfigError(f"{flag} {text!r}: expected MIN:MAX, e.g. 2:16")
    return lo, hi


class AutoscaleConfig(_Section):
    enabled: bool = False
    """`up` scales the fleet between min_replicas and max_replicas (`up --autoscale MIN:MAX`
    sets all three); it starts replicas.count of them, moved inside the bounds."""

    min_replicas: int = Field(default=1, ge=0)
    """Fewest replicas (`up` keeps at least 1; 0 is for `sim`)."""

    max_replicas: int = Field(default=2, ge=1)
    """Most replicas."""

    policy: ScalingPolicyName = ScalingPolicyName.STEP
    """`step`: the step rules, +10% above 80% utilisation, -5% below 50%; `predictive`: what
    the forecast arrivals need (needs replica_rps), never below step's step up; `target`:
    HPA-like (docs/autoscale.md, "Autoscaling policies")."""

    interval_s: float = Field(default=5.0, gt=0)
    """How often the controller asks the policy (arrivals are counted every second)."""

    pool_interval_s: float = Field(default=1.0, gt=0)
    """Behind a warm pool (replicas.asleep): how often the controller asks instead. A wake
    takes about a second, so the tick is most of what a burst waits for; a decision costs
    well under a millisecond. On `make bench-autoscale` it brought the held-out bursts to
    the oracle's attainment (docs/benchmarks.md)."""

    target: float = Field(default=0.7, gt=0, le=1)
    """policy target: the share of the concurrency budgets to aim at."""

    replica_rps: float | None = Field(default=None, gt=0)
    """policy predictive: requests per second one replica serves within the SLO (the sweet
    spot of `servepilot bench` on one replica, or `sim --replicas 1 --sweep`)."""

    forecast_horizon_s: float | None = Field(default=None, gt=0)
    """policy predictive: how far ahead to size for. None: the first replicas' measured
    start-up time plus interval_s."""

    window_s: float | None = Field(default=None, ge=0)
    """policy step: the utilisation compared with the lines is its peak over this window.
    None: the rules' 60 s."""

    up_cooldown_s: float | None = Field(default=None, ge=0)
    """policy step: from the fleet's last change to the next step up. None: the rules' 30 s."""

    down_cooldown_s: float | None = Field(default=None, ge=0)
    """policy step: from the fleet's last change to the next step down. None: the rules' 60 s."""

    drain_timeout_s: float = Field(default=30.0, ge=0)
    """A replica being removed gets this long to finish its requests before it is stopped."""

    adaptive_budget: AdaptiveBudgetConfig = Field(default_factory=AdaptiveBudgetConfig)
    """Adaptive batch thresholds: each tick, every replica's admission budget follows the
    measured arrival rate (off by default; docs/autoscale.md)."""

    def tick_s(self, pool: int) -> float:
        """How often the controller decides, behind a warm pool of `pool` or none."""
        return min(self.interval_s, self.pool_interval_s) if pool else self.interval_s

    @model_validator(mode="after")
    def _bounds_and_rate(self) -> AutoscaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )
        if self.policy is ScalingPolicyName.PREDICTIVE and self.replica_rps is None:
            raise ValueError(
                "policy predictive needs replica_rps (up's --replica-rps): the requests per "
                "second one replica serves within the SLO"
            )
        return self
