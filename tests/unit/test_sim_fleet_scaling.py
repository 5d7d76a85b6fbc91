"""Cold starts and the autoscaler in the fleet simulator: when a replica starts serving, what
the policy is shown, and the replicas it asks for under load."""

from __future__ import annotations

import itertools

import pytest

from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.target_utilisation import TargetUtilisation
from servepilot.sim.fleet.traffic import Job
from tests.unit.sim_fleet_support import (
    alone_steps,
    fleet_spec,
    run_open,
)


def test_cold_start_delays_service_by_cold_start_s() -> None:
    spec = fleet_spec(start_cold=True, cold_start_s=10.0, scrape_interval_s=1.0)
    sim, out = run_open(spec, [Job(100, 1)], iter([0.0]), 1)
    service = alone_steps(100, 1)[0]
    assert sim.replicas[0].ready_s == pytest.approx(10.0)
    # Ready at the scrape at 10 s; the queued request goes at the next tick (20 ms apart).
    ttft_ms = out.run.ttft_ms.p50
    assert ttft_ms is not None
    assert 10.0 + service <= ttft_ms / 1000 <= 10.0 + 0.02 + service + 1e-9


def test_a_cold_start_longer_than_the_wait_fails_with_503() -> None:
    spec = fleet_spec(start_cold=True, cold_start_s=100.0, scrape_interval_s=1.0)
    _, out = run_open(spec, [Job(100, 1)], iter([0.0]), 1)
    assert out.run.errors == {"http_503": 1}
    assert out.run.duration_s == pytest.approx(60.0, abs=0.01)


class _Recorder:
    name = "recorder"

    def __init__(self, desired: int) -> None:
        self.desired = desired
        self.calls: list[FleetSnapshot] = []

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        self.calls.append(snapshot)
        return ScaleDecision(self.desired, ScaleReason.HOLD)


def test_autoscaler_is_asked_and_a_new_replica_serves_after_its_cold_start() -> None:
    recorder = _Recorder(desired=2)
    spec = fleet_spec(cold_start_s=30.0, scrape_interval_s=1.0, autoscale_interval_s=5.0)
    offsets = (i * 0.1 for i in itertools.count())
    sim, out = run_open(spec, [Job(100, 5)], offsets, 1000, autoscaler=recorder)
    assert recorder.calls and recorder.calls[0].now_s == 5.0
    assert recorder.calls[0].ready == 1
    assert any(s.starting == 1 for s in recorder.calls)
    new = sim.replicas[1]
    assert new.launched_s == 5.0
    assert new.ready_s == pytest.approx(35.0)
    assert new.dispatched > 0 and out.stats.replicas_peak == 2


def test_autoscaler_adds_replicas_under_load() -> None:
    spec = fleet_spec(capacity=8, cold_start_s=5.0, scrape_interval_s=1.0, autoscale_interval_s=2.0)
    offsets = (i * 0.01 for i in itertools.count())
    sim, out = run_open(
        spec, [Job(200, 40)], offsets, 3000, autoscaler=TargetUtilisation(max_replicas=6)
    )
    assert out.stats.replicas_peak > 1
    assert sum(r.dispatched for r in sim.replicas[1:]) > 0
