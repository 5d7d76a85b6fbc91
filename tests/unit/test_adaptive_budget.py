"""Seed 003's adaptive batch thresholds (autoscale.adaptive_budget): the pure decision with
known answers (band edges, hysteresis, the rate's window and basis, clamping), its config's
errors, the gateway's budget setter under requests in flight, the controller applying it each
tick, and the simulator moving its replicas' budgets on a rate step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servepilot.cli.main import main
from servepilot.core.config import (
    AdaptiveBudgetConfig,
    FleetConfig,
    GatewayConfig,
    RateBasis,
    parse_config,
)
from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode, load_result
from servepilot.core.slo import Slo
from servepilot.fleet.autoscale.metrics import AutoscaleCollector
from servepilot.fleet.autoscale.start import check_autoscale
from servepilot.fleet.autoscale.view import GatewayView
from servepilot.load.loadplan import LoadPlan
from servepilot.plan.costmodel import CostModel
from servepilot.scaling.adaptive_budget import AdaptiveBudget, Band, BudgetDecision, next_band
from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample, ScaleDecision, ScaleReason
from servepilot.sim import SchedulerConfig
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec
from servepilot.sim.fleet.traffic import Job, JobTable
from tests.unit.autoscale_fakes import Scripted, rig
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    chat,
    eventually,
    gateway_in_front_of,
    in_background,
    queued,
    run,
    until,
)

SEED = AdaptiveBudgetConfig(enabled=True)
"""The seed's numbers: lines 20 and 100 req/s, budgets 32 and 8 (middle 20), hysteresis 10%."""


def _snapshot(rate: float, seconds: int = 30, ready: int = 1) -> FleetSnapshot:
    replicas = tuple(ReplicaSample(f"r{i}", True, 0, 0, 0, 0.0, 0.0, 64) for i in range(ready))
    return FleetSnapshot(100.0, replicas, arrivals_per_s=(rate,) * seconds)


# --- the pure decision ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "band"),
    [(0.0, Band.LOW), (19.9, Band.LOW), (20.0, Band.MIDDLE), (100.0, Band.MIDDLE),
     (100.1, Band.PEAK)],
)  # fmt: skip
def test_the_first_decision_takes_the_band_the_rate_lies_in(rate: float, band: Band) -> None:
    assert next_band(None, rate, SEED) is band


@pytest.mark.parametrize(
    ("before", "rate", "after"),
    [
        # Up across 20 only above 22, down across it only below 18.
        (Band.LOW, 21.9, Band.LOW), (Band.LOW, 22.1, Band.MIDDLE),
        (Band.MIDDLE, 18.1, Band.MIDDLE), (Band.MIDDLE, 17.9, Band.LOW),
        # Up across 100 only above 110, down across it only below 90.
        (Band.MIDDLE, 109.0, Band.MIDDLE), (Band.MIDDLE, 111.0, Band.PEAK),
        (Band.PEAK, 91.0, Band.PEAK), (Band.PEAK, 89.0, Band.MIDDLE),
        # Both lines at once.
        (Band.LOW, 120.0, Band.PEAK), (Band.PEAK, 10.0, Band.LOW),
    ],
)  # fmt: skip
def test_a_line_is_crossed_once_the_rate_is_past_it_by_the_hysteresis(
    before: Band, rate: float, after: Band
) -> None:
    assert next_band(before, rate, SEED) is after


def test_a_rate_hovering_at_the_peak_line_does_not_flip_the_budget() -> None:
    budget = AdaptiveBudget(SEED)
    answers = [budget.decide(_snapshot(rate)).budget for rate in (120, 95, 105, 92, 108, 85)]
    assert answers == [8, 8, 8, 8, 8, 20]
    plain = AdaptiveBudget(AdaptiveBudgetConfig(enabled=True, hysteresis=0.0))
    assert [plain.decide(_snapshot(r)).budget for r in (120, 95, 105, 92)] == [8, 20, 8, 20]


def test_the_rate_is_the_window_mean_fleet_wide_or_per_ready_replica() -> None:
    arrivals = (500.0,) * 10 + (50.0,) * 30  # a burst that left the 30 s window
    snapshot = FleetSnapshot(100.0, _snapshot(0, ready=4).replicas, arrivals_per_s=arrivals)
    fleet = AdaptiveBudget(SEED).decide(snapshot)
    assert (fleet.rate_rps, fleet.band, fleet.budget) == (50.0, Band.MIDDLE, 20)
    assert fleet.detail == "50.0 req/s over 30 s, lines 20/100: middle"
    per = AdaptiveBudget(SEED.model_copy(update={"rate": RateBasis.REPLICA, "window_s": 40}))
    per_replica = per.decide(snapshot)
    # (10 x 500 + 30 x 50) / 40 s = 162.5 req/s over 4 ready replicas.
    assert (per_replica.rate_rps, per_replica.band) == (162.5 / 4, Band.MIDDLE)
    empty = AdaptiveBudget(SEED).decide(FleetSnapshot(0.0, ()))
    assert (empty.rate_rps, empty.band, empty.budget) == (0.0, Band.LOW, 32)


def test_the_budget_applied_stays_within_one_and_the_replicas_hard_capacity() -> None:
    decision = BudgetDecision(32, Band.LOW, 0.0, "")
    assert [decision.applied(hard) for hard in (256, 32, 12, 1)] == [32, 32, 12, 1]
    assert BudgetDecision(0, Band.PEAK, 0.0, "").applied(8) == 1


def test_middle_budget_defaults_to_halfway_and_can_be_set() -> None:
    assert SEED.middle == 20
    assert AdaptiveBudgetConfig(low_budget=32, peak_budget=7).middle == 20  # 19.5 rounds even
    assert AdaptiveBudgetConfig(middle_budget=16).middle == 16


@pytest.mark.parametrize(
    ("section", "names"),
    [
        ({"low_rps": 100, "peak_rps": 20}, "low_rps (100) must be below peak_rps (20)"),
        ({"peak_budget": 0}, "autoscale.adaptive_budget.peak_budget"),
        ({"hysteresis": 0.5}, "autoscale.adaptive_budget.hysteresis"),
        ({"rate": "cluster"}, "autoscale.adaptive_budget.rate"),
        (
            {"window": 30},
            "autoscale.adaptive_budget.window: unknown field; did you mean `window_s`?",
        ),
    ],
)
def test_config_errors_name_the_field(section: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigError, match="adaptive_budget") as caught:
        parse_config({"autoscale": {"adaptive_budget": section}}, origin="fleet.yaml")
    assert names in str(caught.value)


def test_up_refuses_an_adaptive_budget_without_the_autoscaler() -> None:
    config = FleetConfig.model_validate({"autoscale": {"adaptive_budget": {"enabled": True}}})
    with pytest.raises(ConfigError, match=r"needs autoscale\.enabled"):
        check_autoscale(config)
    check_autoscale(config.with_overrides({"autoscale.enabled": True}))


# --- the gateway's setter ----------------------------------------------------------------


def test_a_budget_lowered_below_in_flight_drops_nothing_and_new_requests_wait() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=4).start()
        upstream.hold_requests = True
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            replies = [in_background(client, url, chat(f"r{i}")) for i in range(4)]
            await eventually(until(lambda: upstream.holding == 4))
            gw.pool.set_budget("a", 2)
            assert gw.pool.get("a").in_flight == 4  # nothing cut
            replies.append(in_background(client, url, chat("late")))
            await eventually(queued(gw, 1))
            upstream.release_next()
            upstream.release_next()
            await eventually(until(lambda: upstream.holding == 2))
            await asyncio.sleep(0.1)
            assert len(gw.dispatcher.queue) == 1  # 2 in flight: still at the budget
            upstream.release_next()
            await eventually(until(lambda: len(upstream.received) == 5))
            assert upstream.holding == 2 and len(gw.dispatcher.queue) == 0
            # Raised again (here by the controller's edge, past the hard capacity: capped),
            # waiters get the new slots with no request finishing.
            replies += [in_background(client, url, chat(f"w{i}")) for i in range(3)]
            await eventually(queued(gw, 3))
            changed = GatewayView(gw).apply_budget(BudgetDecision(64, Band.LOW, 0.0, ""))
            assert changed == 1 and gw.pool.get("a").capacity == 4
            await eventually(until(lambda: upstream.holding == 4))
            assert len(gw.dispatcher.queue) == 1
            upstream.release_all()
            assert [(await reply).status for reply in replies] == [200] * 8
            with pytest.raises(ValueError, match=r"budget 5 outside \[1, 4\]"):
                gw.pool.set_budget("a", 5)
            assert gw.pool.get("a").to_json()["hard_capacity"] == 4

    run(body())


# --- the controller ----------------------------------------------------------------------


def test_the_controller_applies_the_budget_each_tick_and_shows_it() -> None:
    controller, fleet, _, clock = rig(Scripted(1), {"r0": 0}, budget=AdaptiveBudget(SEED))

    async def ticks(rates: list[float]) -> list[tuple[Band, int]]:
        seen = []
        for rate in rates:
            fleet.arrivals_per_s = (rate,) * 30
            decision = await controller.tick()
            assert decision.budget is not None
            seen.append((decision.budget.band, decision.budget.budget))
            clock.now_s += 5
        return seen

    answers = asyncio.run(ticks([5.0, 150.0, 95.0, 50.0]))
    assert answers == [(Band.LOW, 32), (Band.PEAK, 8), (Band.PEAK, 8), (Band.MIDDLE, 20)]
    # Capped at the fake gateway's hard capacity (4) as the view caps each replica.
    assert fleet.budgets == [4, 4, 4, 4]
    assert controller.last is not None
    assert controller.last.line() == (
        "autoscale: 1 replicas (hold: told so); budget 20 per replica "
        "(50.0 req/s over 30 s, lines 20/100: middle)"
    )
    families = {m.name: m for m in AutoscaleCollector(controller).collect()}
    assert families["servepilot_autoscale_replica_budget"].samples[0].value == 20
    bands = {
        s.labels["band"]: s.value for s in families["servepilot_autoscale_budget_band"].samples
    }
    assert bands == {"low": 0, "middle": 1, "peak": 0}


def test_without_an_adaptive_budget_the_controller_leaves_budgets_alone() -> None:
    controller, fleet, _, _ = rig(Scripted(1), {"r0": 0})
    decision = asyncio.run(controller.tick())
    assert decision.budget is None and fleet.budgets == []
    assert "budget" not in decision.line()
    names = {m.name for m in AutoscaleCollector(controller).collect()}
    assert "servepilot_autoscale_replica_budget" not in names


# --- the simulator -----------------------------------------------------------------------


class _Holding:
    """Keeps the fleet's size, and the snapshots it was shown."""

    name = "holding"

    def __init__(self) -> None:
        self.seen: list[FleetSnapshot] = []

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        self.seen.append(snapshot)
        return ScaleDecision(snapshot.provisioned, ScaleReason.HOLD)


def _one_replica(capacity: int) -> FleetSpec:
    scheduler = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                                max_model_len=2048, block_size=16, num_blocks=4000)  # fmt: skip
    cost = CostModel(0.01, 1e-4, 1e-3, 2e-3, 1e-6, 0.0, source="test")
    return FleetSpec(scheduler=scheduler, cost=cost, replicas=1, capacity=capacity,
                     gateway=GatewayConfig(), network=NetworkConfig(cross_node=Delay()),
                     scrape_interval_s=1.0, autoscale_interval_s=5.0)  # fmt: skip


def _stepped_offsets(steps: list[tuple[float, float]]) -> list[float]:
    """Evenly spaced sends: (until_s, rate) pieces in order."""
    offsets: list[float] = []
    start = 0.0
    for until_s, rate in steps:
        offsets += [start + i / rate for i in range(round((until_s - start) * rate))]
        start = until_s
    return offsets


def test_the_simulated_replicas_budget_follows_a_rate_step() -> None:
    config = AdaptiveBudgetConfig(enabled=True, window_s=5, low_rps=10, peak_rps=40,
                                  low_budget=32, peak_budget=2, hysteresis=0.1)  # fmt: skip
    script = _Holding()
    sim = FleetSim(_one_replica(8), autoscaler=script, budget=AdaptiveBudget(config))
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=50), duration_s=90.0, grace_s=5.0)
    offsets = _stepped_offsets([(30.0, 5.0), (60.0, 50.0), (90.0, 5.0)])
    sim.run(plan, JobTable([Job(50, 5)]), Slo(), offsets=iter(offsets))
    assert sim.autoscale is not None
    events = [(e.at_s, e.decision.band, e.decision.budget) for e in sim.autoscale.budget_events]
    # 5 req/s: the low band, whose 32 is capped at the replica's 8 (no change); the first tick
    # whose 5 s window is all at 50 req/s (above 44) goes to the peak band; back below 9
    # req/s, to the low band.
    assert events == [(35.0, Band.PEAK, 2), (65.0, Band.LOW, 32)]
    budgets = {s.now_s: s.replicas[0].budget for s in script.seen}
    assert (budgets[30.0], budgets[35.0], budgets[40.0], budgets[60.0], budgets[70.0]) == (
        8, 8, 2, 2, 8)  # fmt: skip
    assert sim.replicas[0].capacity == 8 and sim.replicas[0].view.capacity == 8


def test_sim_applies_fleet_yaml_s_adaptive_budget_and_refuses_it_without_an_autoscaler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(
        "autoscale:\n  adaptive_budget: {enabled: true, window_s: 5, low_rps: 1, peak_rps: 3,"
        " peak_budget: 1}\n"
    )
    load = ["--rate", "4", "--duration", "20s", "--input-tokens", "32", "--output-tokens", "4"]
    args = ["sim", "-c", str(fleet_yaml), *load, "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert "autoscale.adaptive_budget.enabled" in capsys.readouterr().err
    assert main([*args, "--autoscale", "1:1", "--autoscale-interval", "5s"]) == 0
    described = load_result(tmp_path / "out" / "results.json").target["adaptive_budget"]
    assert (described["peak_rps"], described["peak_budget"], described["low_budget"]) == (
        3.0, 1, 32)  # fmt: skip
