"""The autoscaling policies by name (`ScalingPolicyName`, in core: fleet.yaml names them), and
what building one takes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from servepilot.core.config import AutoscaleConfig, ScalingPolicyName
from servepilot.core.errors import ConfigError
from servepilot.scaling.predictive import ForecastSizing, PredictivePolicy
from servepilot.scaling.snapshot import AutoscalePolicy
from servepilot.scaling.step import StepPolicy, StepRules
from servepilot.scaling.target_utilisation import TargetUtilisation


@dataclass(frozen=True, slots=True)
class AutoscaleSetup:
    """Everything a policy is built from; the fields a policy does not read are ignored."""

    policy: ScalingPolicyName
    min_replicas: int
    max_replicas: int
    target: float = 0.7
    """`target`'s share of the concurrency budgets."""
    replica_rps: float | None = None
    """`predictive`'s requests per second one replica serves within the SLO."""
    horizon_s: float = 0.0
    """`predictive`'s forecast horizon: the cold start plus a tick."""
    window_s: float | None = None
    """The step rules' peak window (`step`, `predictive`); None: `StepRules`' own."""
    up_cooldown_s: float | None = None
    down_cooldown_s: float | None = None
    pool: int = 0
    """`predictive`: sleeping replicas behind the fleet (a warm pool)."""
    wake_horizon_s: float | None = None
    """`predictive` with a pool: the wake plus a tick."""

    def __post_init__(self) -> None:
        if self.policy is ScalingPolicyName.PREDICTIVE and self.replica_rps is None:
            raise ConfigError(
                "the predictive policy needs the requests per second one replica serves "
                "within the SLO (sim's --replica-rps)",
                hint="simulate one replica: servepilot sim --replicas 1 --sweep (the sweet spot)",
            )

    @classmethod
    def from_section(
        cls, section: AutoscaleConfig, cold_start_s: float, pool: int = 0
    ) -> AutoscaleSetup:
        """fleet.yaml's `autoscale` section (what `up` runs, and `sim -c` without
        --autoscale); predictive's horizon by default `cold_start_s` plus a tick (behind a
        pool of `pool`, its shorter tick)."""
        horizon_s = section.forecast_horizon_s or cold_start_s + section.tick_s(pool)
        return cls(section.policy, section.min_replicas, section.max_replicas, section.target,
                   section.replica_rps, horizon_s, section.window_s, section.up_cooldown_s,
                   section.down_cooldown_s)  # fmt: skip

    def with_pool(self, pool: int, wake_s: float, tick_s: float) -> AutoscaleSetup:
        """The same behind a warm pool of `pool` sleeping replicas woken in `wake_s`: the
        policy then starts cold only what the pool cannot wake within the wake and a tick
        (`up`'s controller and `sim -c` build it alike)."""
        if not pool:
            return self
        return replace(self, pool=pool, wake_horizon_s=min(self.horizon_s, wake_s + tick_s))

    def describe(self) -> dict[str, object]:
        """For a results file: the policy and the numbers it reads."""
        out: dict[str, object] = {
            "policy": self.policy.value,
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
        }
        if self.policy is ScalingPolicyName.TARGET:
            out["target"] = self.target
        if self.policy is ScalingPolicyName.PREDICTIVE:
            out |= {"replica_rps": self.replica_rps, "horizon_s": self.horizon_s}
            if self.pool:
                out |= {"pool": self.pool, "wake_horizon_s": self.wake_horizon_s}
        return out

    def build(self) -> AutoscalePolicy:
        """A fresh policy (each keeps its own state: one per fleet, or per simulated level)."""
        if self.policy is ScalingPolicyName.TARGET:
            return TargetUtilisation(self.target, self.min_replicas, self.max_replicas)
        rules = self.step_rules()
        if self.policy is ScalingPolicyName.STEP:
            return StepPolicy(rules)
        assert self.replica_rps is not None
        wake_s = self.wake_horizon_s if self.pool else None
        sizing = ForecastSizing(
            self.replica_rps, self.horizon_s, pool=self.pool, wake_horizon_s=wake_s
        )
        return PredictivePolicy(sizing, rules)

    def step_rules(self) -> StepRules:
        """The seeds' rules within [min, max], with the timings given here (else theirs)."""
        rules = StepRules(min_replicas=self.min_replicas, max_replicas=self.max_replicas)
        return replace(
            rules,
            window_s=_given(self.window_s, rules.window_s),
            up_cooldown_s=_given(self.up_cooldown_s, rules.up_cooldown_s),
            down_cooldown_s=_given(self.down_cooldown_s, rules.down_cooldown_s),
        )


def _given(value: float | None, default: float) -> float:
    return default if value is None else value
