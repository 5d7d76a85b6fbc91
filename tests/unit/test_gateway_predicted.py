"""predicted_latency behind the real gateway: it gets the policy by name with the step model
it is given, and keeps each shared prefix where it is cached; `up`'s step model is the one
the simulator steps a replica of the same fleet.yaml by."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from servepilot.cli.up_cmd import predicted_step_model
from servepilot.core.config import FleetConfig, GatewayConfig, PolicyName
from servepilot.core.errors import ConfigError
from servepilot.engine.cpu import cpu_flags
from servepilot.gateway import Gateway
from servepilot.plan.costmodel import CostModel
from servepilot.plan.costprofile import save_profile
from servepilot.plan.step_latency import StepLatency
from servepilot.routing import PredictedLatency
from servepilot.sim.fleet.setup import fleet_step_model, replica_setup
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import gateway_in_front_of, run, scrape
from tests.unit.test_gateway_routing import stats, two_families

# 1 ms a step and a microsecond a token: the predicted prefills are over before the next
# request comes, so only the cached prefix tells the replicas apart.
FAST = StepLatency(CostModel(1e-3, 1e-6, 0.0, 1e-5, 0.0, 0.0, source="test"), 2048)
CONFIG = GatewayConfig(port=0, health_interval_s=0.05, connect_timeout_s=1.0,
                       policy=PolicyName.PREDICTED_LATENCY)  # fmt: skip


def test_the_gateway_builds_it_by_name_on_its_own_clock() -> None:
    def clock() -> float:
        return 42.0

    gateway = Gateway(CONFIG, clock=clock, step_model=lambda _: FAST)
    assert type(gateway.policy) is PredictedLatency
    assert gateway.policy._clock is clock  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="step-time model"):
        Gateway(CONFIG)


def test_each_shared_prefix_stays_where_it_is_cached() -> None:
    async def body() -> None:
        upstreams = [await FakeUpstream(name).start() for name in ("a", "b", "c")]
        async with (
            gateway_in_front_of(upstreams, policy=PolicyName.PREDICTED_LATENCY,
                                step_model=lambda _: FAST) as (_, url),
            aiohttp.ClientSession() as client,
        ):  # fmt: skip
            picked = await two_families(client, url, rounds=8)
            assert len(picked["A"]) == 1 and len(picked["B"]) == 1, picked
            counters = stats(await scrape(client, url), "predicted_latency")
            assert counters["predicted_decisions"] == 16
            # All but the first of each family (8 alike each) found its whole prompt cached,
            # the last token aside (vLLM computes it again).
            prompts = counters["predicted_prompt_tokens"]
            assert counters["predicted_cached_tokens"] == 7 / 8 * prompts - 14

    run(body())


def test_up_steps_by_what_the_simulator_steps_a_replica_of_the_same_file_by() -> None:
    config = FleetConfig(gateway=CONFIG)
    made = predicted_step_model(config)
    assert made is not None
    setup = replica_setup(config, None, cpu_flags())
    expected = StepLatency(setup.cost, setup.scheduler.max_num_batched_tokens)
    assert made("r0") == made("r7") == expected == fleet_step_model(config, cpu_flags())
    assert predicted_step_model(FleetConfig()) is None  # another policy: none needed


def test_a_calibrated_profile_gives_the_step_times(tmp_path: Path) -> None:
    calibrated = CostModel(0.02, 3e-4, 1e-3, 4e-3, 2e-6, 1e-9, source="calibrated: test")
    profile = tmp_path / "profile.json"
    save_profile(calibrated, profile, meta={})
    routing = CONFIG.routing.model_copy(update={"step_profile": str(profile)})
    config = FleetConfig(gateway=CONFIG.model_copy(update={"routing": routing}))
    model = fleet_step_model(config, cpu_flags())
    assert model.cost.coefficients == calibrated.coefficients
    assert model.decode_step_s(10, 1000) == pytest.approx(0.02 + 10 * 4e-3 + 1000 * 2e-6)
