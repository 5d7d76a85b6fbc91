"""The simulated fleet's warm pool (sim/fleet/replicas.py): a replica asked for is woken
before any starts cold, one given back falls asleep before any stops, the pool is refilled,
and its time is counted awake and asleep apart; all with times known in advance."""

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
from servepilot.sim import SchedulerConfig
from servepilot.sim.fleet.members import ReplicaState
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec
from servepilot.sim.fleet.traffic import Job, JobTable
from tests.unit.test_autoscale_sim import COST, _Script


def _spec(**changes: Any) -> FleetSpec:
    scheduler = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                                max_model_len=2048, block_size=16, num_blocks=4000)  # fmt: skip
    fields: dict[str, Any] = dict(
        scheduler=scheduler, cost=COST, replicas=1, capacity=8, gateway=GatewayConfig(),
        network=NetworkConfig(cross_node=Delay()), scrape_interval_s=1.0,
        autoscale_interval_s=5.0, cold_start_s=60.0, wake_s=2.0, sleep_s=3.0,
    )  # fmt: skip
    return FleetSpec(**(fields | changes))


def _run(spec: FleetSpec, script: _Script, seconds: float) -> FleetSim:
    sim = FleetSim(spec, autoscaler=script)
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=1.0), duration_s=seconds, grace_s=5.0)
    sim.run(plan, JobTable([Job(50, 5)]), Slo(), offsets=(float(i) for i in itertools.count()))
    return sim


def test_a_replica_asked_for_is_woken_in_the_wake_time_not_started_cold() -> None:
    # Pool of 1 asleep from the start; at 5 s two serve: r1 is woken (2 s), ready at the
    # scrape after 7 s; the pool is refilled by r2, starting cold at 5 s, asleep at 5 + 60 +
    # 3 = 68 s.
    script = _Script([(5.0, 2)])
    sim = _run(_spec(warm_pool=1), script, 100.0)
    _, r1, r2 = sim.replicas
    assert r1.launched_s == 0.0 and r1.ready_s == pytest.approx(7.0)
    assert r2.launched_s == 5.0 and r2.state is ReplicaState.ASLEEP
    assert r2.asleep_since_s == pytest.approx(68.0)
    assert sim.fleet.wakes == 1
    # At 10 s the woken replica counts as serving: the snapshot sees 2 (not asking again).
    assert [s.provisioned for s in script.seen[:3]] == [1, 2, 2]
    # Awake: r0 100 s, r1 100 - 5 asleep, r2 63 (cold start and sleep); asleep r1 5, r2 32.
    awake, asleep = sim.fleet.seconds(100.0)
    assert awake == pytest.approx(100 + 95 + 63)
    assert asleep == pytest.approx(5 + 32)
    assert sim.replica_seconds(100.0) == pytest.approx(awake)


def test_replicas_given_back_stop_while_the_pool_is_full_or_refilling() -> None:
    # Three serve, r3 asleep. At 5 s four: r3 is woken and r4 refills the pool (cold). At
    # 10 s one: the pool will be full once r4 is up, so the three given back (newest first:
    # r3, r2, r1) stop rather than sleep (plan_pool: sleep only into a gap nothing fills).
    script = _Script([(5.0, 4), (10.0, 1)])
    sim = _run(_spec(replicas=3, warm_pool=1), script, 100.0)
    states = [r.state for r in sim.replicas]
    stopped = ReplicaState.STOPPED
    assert states == [ReplicaState.READY, stopped, stopped, stopped, ReplicaState.ASLEEP]
    assert sim.replicas[4].asleep_since_s == pytest.approx(68.0)
    # r3 was asleep 0-5 s, then awake until it stopped at 10 s.
    assert sim.replicas[3].asleep_total_s == pytest.approx(5.0)
    assert sim.replicas[3].stopped_s == pytest.approx(10.0, abs=0.5)


def test_without_a_pool_the_fleet_starts_and_stops_cold() -> None:
    sim = _run(_spec(), _Script([(5.0, 2)]), 20.0)
    assert len(sim.replicas) == 2 and sim.replicas[1].ready_s is None  # still starting at 20 s
    assert sim.fleet.seconds(20.0) == (pytest.approx(35.0), 0.0)


def test_sim_reports_replica_hours_awake_and_asleep_apart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    load = ["--rate", "4", "--duration", "60s", "--input-tokens", "32", "--output-tokens", "4"]
    flags = ["--autoscale", "1:4", "--scaling-policy", "oracle", "--replica-rps", "3",
             "--warm-pool", "2", "--wake-time", "1s", "--sleep-time", "2s"]  # fmt: skip
    assert main(["sim", *load, *flags, "--out", str(out)]) == 0
    result = load_result(out / "results.json")
    level = result.target["levels"][0]
    assert level["replica_hours"] > 0 and level["replica_hours_asleep"] > 0
    assert level["wakes"] >= 1
    assert result.target["warm_pool"] == {"replicas": 2, "wake_s": 1.0, "sleep_s": 2.0,
                                          "refill": "cold"}  # fmt: skip


def test_refilled_by_sleeps_a_replica_given_back_falls_asleep_instead_of_stopping() -> None:
    # --pool-refill sleep: three serve, r3 asleep. At 5 s four: r3 woken, nothing started
    # cold. At 10 s one: the newest given back (r3) drains and falls asleep (3 s, its GPU
    # held), r2 and r1 stop.
    spec = _spec(replicas=3, warm_pool=1, cold_refill=False)
    sim = _run(spec, _Script([(5.0, 4), (10.0, 1)]), 60.0)
    assert len(sim.replicas) == 4  # no cold refill
    _, r1, r2, r3 = sim.replicas
    assert (r1.state, r2.state) == (ReplicaState.STOPPED, ReplicaState.STOPPED)
    assert r3.state is ReplicaState.ASLEEP and sim.fleet.wakes == 1
    assert r3.asleep_since_s == pytest.approx(13.0, abs=0.5)
    awake, asleep = sim.fleet.seconds(60.0)
    # r0 60; r1, r2 10 each; r3 asleep 0-5, awake 5-13, asleep 13-60.
    assert awake == pytest.approx(60 + 10 + 10 + 8, abs=1.0)
    assert asleep == pytest.approx(5 + 47, abs=1.0)
