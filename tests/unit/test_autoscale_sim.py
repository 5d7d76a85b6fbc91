"""The simulator runs the policies of `scaling/` as they are: the snapshot it builds for them
(per replica samples, queue by class, arrivals per second), the replica time a run paid
for, the scale events, and `sim --scaling-policy` end to end."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from servepilot.cli.main import main
from servepilot.core.config import GatewayConfig
from servepilot.core.results import Load, LoadMode, load_result
from servepilot.core.slo import Slo
from servepilot.load.loadplan import LoadPlan
from servepilot.plan.costmodel import CostModel
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.sim import SchedulerConfig
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec
from servepilot.sim.fleet.traffic import Job, JobTable

COST = CostModel(0.01, 1e-4, 1e-3, 2e-3, 1e-6, 0.0, source="test")


def _spec(**changes: Any) -> FleetSpec:
    scheduler = SchedulerConfig(
        max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=2048, block_size=16,
        num_blocks=4000,
    )  # fmt: skip
    fields: dict[str, Any] = dict(
        scheduler=scheduler, cost=COST, replicas=1, capacity=8, gateway=GatewayConfig(),
        network=NetworkConfig(cross_node=Delay()), scrape_interval_s=1.0,
    )  # fmt: skip
    return FleetSpec(**(fields | changes))


class _Script:
    """Answers a fixed count per time: the last (from_s, replicas) whose from_s has come."""

    name = "script"

    def __init__(self, plan: list[tuple[float, int]]) -> None:
        self.plan = plan
        self.seen: list[FleetSnapshot] = []

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        self.seen.append(snapshot)
        wanted = [n for at_s, n in self.plan if at_s <= now_s]
        return ScaleDecision(wanted[-1] if wanted else snapshot.provisioned, ScaleReason.HOLD)


def _run(spec: FleetSpec, policy: _Script, seconds: float, gap_s: float = 0.1) -> FleetSim:
    sim = FleetSim(spec, autoscaler=policy)
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=1 / gap_s), duration_s=seconds, grace_s=5.0)
    offsets = (i * gap_s for i in itertools.count())
    sim.run(plan, JobTable([Job(50, 5)]), Slo(), offsets=offsets)
    return sim


def test_the_snapshot_carries_samples_arrivals_and_fresh_gauges() -> None:
    script = _Script([])
    _run(_spec(autoscale_interval_s=5.0), script, 20.0)
    first = script.seen[0]
    assert first.now_s == 5.0 and first.provisioned == 1 and first.ready == 1
    sample = first.replicas[0]
    assert (sample.replica_id, sample.ready, sample.budget) == ("r0", True, 8)
    assert 0.0 <= sample.metrics_age_s <= 1.0  # scraped every second
    # Sends every 0.1 s from 0: 10 in each of the closed seconds 0-1 ... 4-5.
    assert first.arrivals_per_s == (10.0,) * 5
    assert script.seen[1].arrivals_per_s == (10.0,) * 10
    assert first.queued_by_class == (0, 0, 0) and first.draining == 0


def test_replica_seconds_count_from_launch_to_stop_and_events_are_logged() -> None:
    # One replica all along; a second launched at 5 s (cold 2 s: paid for from its launch)
    # and given back at 10 s, idle by then: 20 + 5 replica seconds over the first 20 s.
    script = _Script([(5.0, 2), (10.0, 1)])
    sim = _run(_spec(autoscale_interval_s=5.0, cold_start_s=2.0), script, 20.0, gap_s=1.0)
    second = sim.replicas[1]
    assert second.launched_s == 5.0 and second.stopped_s == pytest.approx(10.0, abs=0.5)
    assert sim.replica_seconds(20.0) == pytest.approx(25.0, abs=0.5)
    assert sim.autoscale is not None
    events = [(e.at_s, e.before, e.decision.replicas) for e in sim.autoscale.events]
    assert events == [(5.0, 1, 2), (10.0, 2, 1)]


@pytest.mark.parametrize(
    "flags",
    [
        ["--scaling-policy", "step"],
        ["--scaling-policy", "predictive", "--replica-rps", "3"],
        ["--scaling-policy", "target"],
    ],
)
def test_sim_runs_each_policy(tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "out"
    load = ["--rate", "4", "--duration", "20s", "--input-tokens", "32", "--output-tokens", "4"]
    scale = ["--autoscale", "1:3", "--cold-start", "5s", "--autoscale-interval", "5s"]
    args = ["sim", *load, *scale]
    assert main([*args, *flags, "--out", str(out)]) == 0
    result = load_result(out / "results.json")
    assert result.runs[0].completed >= 70
    level = result.target["levels"][0]
    assert level["scale_events"] >= 0 and level["replica_hours"] > 0
    described = result.target["autoscale"]
    assert (described["policy"], described["min_replicas"], described["max_replicas"]) == (
        flags[1],
        1,
        3,
    )


def test_predictive_without_replica_rps_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sim", "--autoscale", "2:4", "--scaling-policy", "predictive", "--requests", "3"])
    assert code == 2
    assert "--replica-rps" in capsys.readouterr().err
