"""`sim --autoscale MIN:MAX --scaling-policy ...`: the policy it builds, and the texts it
refuses by name."""

from __future__ import annotations

import pytest

from servepilot.core.config import ScalingPolicyName
from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.load.loadplan import LoadPlan
from servepilot.plan.costmodel import CostModel
from servepilot.scaling.oracle import ClairvoyantPolicy, OracleSetup
from servepilot.scaling.policies import AutoscaleSetup
from servepilot.scaling.predictive import PredictivePolicy
from servepilot.scaling.step import StepPolicy
from servepilot.scaling.target_utilisation import TargetUtilisation
from servepilot.sim.engine.records import SchedulerConfig
from servepilot.sim.fleet.records import FleetSpec
from servepilot.sim.fleet.session import level_policy
from servepilot.sim.fleet.setup import autoscaler
from servepilot.sim.fleet.traffic import Job, JobTable

COST = CostModel(0.01, 1e-4, 1e-3, 2e-3, 1e-6, 0.0, source="test")


def test_min_max_builds_the_target_utilisation_policy() -> None:
    assert autoscaler(None) is None and autoscaler("") is None
    setup = autoscaler("2:16", target=0.6)
    assert setup == AutoscaleSetup(ScalingPolicyName.TARGET, 2, 16, 0.6)
    assert isinstance(setup.build(), TargetUtilisation)
    assert autoscaler("0:1") is not None


def test_step_and_predictive_get_min_and_max() -> None:
    step = autoscaler("3:12", "step")
    assert step is not None
    built = step.build()
    assert isinstance(built, StepPolicy)
    assert (built.rules.min_replicas, built.rules.max_replicas) == (3, 12)
    setup = autoscaler("2:20", "predictive", replica_rps=4.0, horizon="90s")
    assert setup is not None
    predictive = setup.build()
    assert isinstance(predictive, PredictivePolicy)
    assert (predictive.sizing.replica_rps, predictive.sizing.horizon_s) == (4.0, 90.0)
    assert predictive.step.rules.max_replicas == 20


def test_the_forecast_horizon_defaults_to_the_cold_start_plus_a_tick() -> None:
    spec = FleetSpec(SchedulerConfig(64, 2048, 2048, 16, 1000), COST, 1, 8, cold_start_s=78.0,
                     autoscale_interval_s=5.0)  # fmt: skip
    setup = autoscaler("2:20", "predictive", replica_rps=4.0, spec=spec)
    assert setup is not None and setup.horizon_s == 83.0
    with pytest.raises(ConfigError, match="--forecast-horizon"):
        autoscaler("2:20", "predictive", replica_rps=4.0, horizon="soon", spec=spec)


def test_predictive_without_replica_rps_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="within the SLO \\(sim's --replica-rps\\)"):
        autoscaler("2:20", "predictive")
    with pytest.raises(ConfigError, match="--replica-rps must be > 0"):
        autoscaler("2:20", "predictive", replica_rps=0.0)


@pytest.mark.parametrize("text", ["3", "2:x", "5:2", "-1:4", "0:0", ":"])
def test_anything_else_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=f"--autoscale '{text}': expected MIN:MAX"):
        autoscaler(text)


def test_the_oracle_is_sim_only_and_sizes_with_replica_rps() -> None:
    spec = FleetSpec(SchedulerConfig(64, 2048, 2048, 16, 1000), COST, 1, 8, cold_start_s=78.0,
                     autoscale_interval_s=5.0)  # fmt: skip
    setup = autoscaler("2:20", "oracle", replica_rps=4.0, spec=spec)
    assert setup == OracleSetup(2, 20, 4.0, 83.0)
    with pytest.raises(ConfigError, match="--replica-rps"):
        autoscaler("2:20", "oracle", spec=spec)
    # fleet.yaml cannot name it: no real fleet knows its future.
    assert "oracle" not in {p.value for p in ScalingPolicyName}


def test_the_oracle_is_told_an_open_loops_schedule_and_refuses_a_closed_loop() -> None:
    oracle = OracleSetup(1, 10, replica_rps=5.0, horizon_s=10.0)
    jobs = JobTable([Job(100, 10)])
    # 4 req/s for 100 s: ceil(4 / (0.8 x 5)) = 1, the minimum.
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=4.0), duration_s=100.0)
    built = level_policy(oracle, plan, jobs)
    assert isinstance(built, ClairvoyantPolicy)
    assert built.peak_rps(50.0) == pytest.approx(4.0, rel=0.25)  # Poisson, a 30 s window
    closed = LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=4), max_requests=10)
    with pytest.raises(ConfigError, match="only an open loop"):
        level_policy(oracle, closed, jobs)
    assert level_policy(None, closed, jobs) is None


def test_with_a_warm_pool_predictive_and_the_oracle_know_the_wake() -> None:
    spec = FleetSpec(SchedulerConfig(64, 2048, 2048, 16, 1000), COST, 1, 8, cold_start_s=78.0,
                     autoscale_interval_s=5.0, warm_pool=3, wake_s=0.8)  # fmt: skip
    setup = autoscaler("2:20", "predictive", replica_rps=4.0, spec=spec)
    assert setup is not None and setup.horizon_s == 83.0
    predictive = setup.build()
    assert isinstance(predictive, PredictivePolicy)
    assert (predictive.sizing.pool, predictive.sizing.wake_horizon_s) == (3, 5.8)
    oracle = autoscaler("2:20", "oracle", replica_rps=4.0, spec=spec)
    assert oracle == OracleSetup(2, 20, 4.0, 83.0, pool=3, wake_horizon_s=5.8)
