"""What surrounds the controller: fleet.yaml's `autoscale` section and up's flags, the
snapshot it builds from the gateway's state, its metrics, what `status` says of it, and what
`up` refuses to autoscale."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from servepilot.cli import up_cmd
from servepilot.core.config import FleetConfig, ScalingPolicyName, parse_config
from servepilot.core.errors import ConfigError
from servepilot.engine.process import ReplicaProcess
from servepilot.engine.simserver.args import SimModel
from servepilot.fleet import control
from servepilot.fleet.autoscale.decision import Decision
from servepilot.fleet.autoscale.metrics import AutoscaleCollector
from servepilot.fleet.autoscale.start import check_autoscale, initial_replicas
from servepilot.fleet.autoscale.view import GatewayView, fleet_snapshot, pool_view
from servepilot.fleet.local import LocalReplicas
from servepilot.fleet.state import AutoscaleRecord, FleetRecord, read_records, write_record
from servepilot.gateway import ReplicaInfo
from servepilot.gateway.replica import SleepState
from servepilot.scaling.policies import AutoscaleSetup
from servepilot.scaling.predictive import PredictivePolicy
from servepilot.scaling.snapshot import ScaleReason
from servepilot.scaling.step import StepPolicy
from tests.unit.autoscale_fakes import Scripted, rig
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import CHAT, VLLM_METRICS, gateway_in_front_of, run


def _up_config(monkeypatch: pytest.MonkeyPatch, *argv: str) -> FleetConfig:
    """The config `up` would run with these flags (caught where --detach would start it)."""
    parser = argparse.ArgumentParser()
    up_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["up", "--detach", *argv])
    captured: list[FleetConfig] = []

    def detach(config: FleetConfig, echo: object) -> None:
        captured.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(up_cmd, "start_detached", detach)
    with pytest.raises(SystemExit):
        up_cmd.run(args)
    return captured[0]


def test_up_flags_set_the_autoscale_section(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _up_config(monkeypatch, "--autoscale", "2:5", "--scaling-policy", "predictive",
                        "--replica-rps", "3.5")  # fmt: skip
    scaling = config.autoscale
    assert (scaling.enabled, scaling.min_replicas, scaling.max_replicas) == (True, 2, 5)
    assert (scaling.policy, scaling.replica_rps) == (ScalingPolicyName.PREDICTIVE, 3.5)
    with pytest.raises(ConfigError, match="--autoscale '5': expected MIN:MAX"):
        _up_config(monkeypatch, "--autoscale", "5")
    with pytest.raises(ConfigError, match="policy predictive needs replica_rps"):
        _up_config(monkeypatch, "--autoscale", "1:3", "--scaling-policy", "predictive")
    assert not _up_config(monkeypatch).autoscale.enabled


def test_the_section_refuses_bad_bounds_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"autoscale: .*min_replicas \(4\) is above max"):
        parse_config({"autoscale": {"min_replicas": 4, "max_replicas": 2}}, origin="fleet.yaml")
    with pytest.raises(ConfigError, match=r"autoscale.interval_s: Input should be greater"):
        parse_config({"autoscale": {"interval_s": 0}}, origin="fleet.yaml")


def test_up_starts_replicas_count_moved_inside_the_bounds() -> None:
    def count(replicas: int, low: int, high: int) -> int:
        scaling = {"enabled": True, "min_replicas": low, "max_replicas": high}
        config = parse_config({"replicas": {"count": replicas}, "autoscale": scaling}, origin="t")
        return initial_replicas(config)

    assert (count(1, 2, 5), count(3, 2, 5), count(9, 2, 5)) == (2, 3, 5)
    off = parse_config({"replicas": {"count": 9}, "autoscale": {"max_replicas": 2}}, origin="t")
    assert initial_replicas(off) == 9


def test_up_refuses_a_minimum_of_zero_and_scales_ray_fleets_too() -> None:
    ray = parse_config({"cluster": {"backend": "ray"}, "autoscale": {"enabled": True}}, origin="t")
    check_autoscale(ray)  # the Ray backend adds and removes replica actors
    zero = parse_config({"autoscale": {"enabled": True, "min_replicas": 0}}, origin="t")
    with pytest.raises(ConfigError, match="keeps at least 1 replica"):
        check_autoscale(zero)
    check_autoscale(parse_config({"cluster": {"backend": "ray"}}, origin="t"))  # not scaling


def test_the_policy_gets_the_sections_timings_and_the_measured_cold_start() -> None:
    scaling = {"enabled": True, "min_replicas": 1, "max_replicas": 3, "window_s": 3,
               "down_cooldown_s": 4, "interval_s": 5}  # fmt: skip
    step = AutoscaleSetup.from_section(
        parse_config({"autoscale": scaling}, origin="t").autoscale, 40.0
    ).build()
    assert isinstance(step, StepPolicy)
    rules = step.rules
    assert (rules.window_s, rules.up_cooldown_s, rules.down_cooldown_s) == (3.0, 30.0, 4.0)
    predictive = {**scaling, "policy": "predictive", "replica_rps": 2.0}
    built = AutoscaleSetup.from_section(
        parse_config({"autoscale": predictive}, origin="t").autoscale, 40.0
    ).build()
    assert isinstance(built, PredictivePolicy)
    assert built.sizing.horizon_s == 45.0  # 40 s measured cold start + a 5 s tick


def _info(rid: str, *, draining: bool = False, scraped_at_s: float | None = 95.0,
          sleep: SleepState = SleepState.AWAKE) -> ReplicaInfo:  # fmt: skip
    return ReplicaInfo(rid, f"http://h/{rid}", True, draining, 3, 0, 2, 1, 0.4, ("m",), 8, None,
                       scraped_at_s, sleep)  # fmt: skip


def test_the_warm_pool_is_no_capacity_and_a_waking_replica_is_capacity_on_its_way() -> None:
    infos = [_info("r0"), _info("r1", sleep=SleepState.ASLEEP),
             _info("r2", sleep=SleepState.PARKED), _info("r3", sleep=SleepState.WAKING),
             _info("r4", sleep=SleepState.FALLING_ASLEEP), _info("r5")]  # fmt: skip
    # r5 is a refill that joined (left out until it sleeps); r6 a refill still starting.
    snap = fleet_snapshot(infos, ("r6", "r7"), (0, 0, 0), (), 100.0, 256, {"r5", "r6"})
    assert [(r.replica_id, r.ready) for r in snap.replicas] == [
        ("r0", True), ("r3", False), ("r7", False),
    ]  # fmt: skip
    assert snap.replicas[1].budget == 8  # a waking replica keeps its own budget
    pool = pool_view(infos)
    assert pool.held == ("r1", "r2")
    assert (pool.waking, pool.falling_asleep) == ({"r3"}, {"r4"})
    assert pool.serving == {"r0", "r5"}


def test_the_snapshot_counts_draining_apart_and_starting_once() -> None:
    infos = [_info("r0"), _info("r1", scraped_at_s=None), _info("r2", draining=True),
             _info("r3")]  # fmt: skip
    snap = fleet_snapshot(infos, ("r3", "r4"), (1, 2, 0), (5.0,), 100.0, 256)
    assert [(r.replica_id, r.ready) for r in snap.replicas] == [
        ("r0", True), ("r1", True), ("r3", True), ("r4", False),
    ]  # fmt: skip
    assert (snap.provisioned, snap.starting, snap.draining, snap.queued) == (4, 1, 1, 3)
    r0, r1 = snap.replicas[0], snap.replicas[1]
    assert (r0.in_flight, r0.running, r0.waiting, r0.kv_usage, r0.budget) == (3, 2, 1, 0.4, 8)
    assert r0.metrics_age_s == 5.0
    assert math.isinf(r1.metrics_age_s)  # never scraped: stale, counted as full
    assert snap.replicas[3].budget == 256 and snap.arrivals_per_s == (5.0,)


def test_the_metrics_say_what_was_decided() -> None:
    controller, _, _, _ = rig(Scripted(2), {"r0": 4})
    registry = CollectorRegistry()
    registry.register(AutoscaleCollector(controller))
    assert b"servepilot_autoscale_desired_replicas" not in generate_latest(registry)
    asyncio.run(controller.tick())
    text = generate_latest(registry).decode()
    assert "servepilot_autoscale_desired_replicas 2.0" in text
    assert "servepilot_autoscale_current_replicas 1.0" in text
    assert 'servepilot_autoscale_decisions_total{direction="up",reason="hold"} 1.0' in text
    assert "servepilot_autoscale_errors_total 0.0" in text
    assert "servepilot_autoscale_gave_up_total 0.0" in text
    assert "servepilot_autoscale_unstopped_replicas 0.0" in text


def test_status_shows_the_policy_bounds_and_last_decision(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SERVEPILOT_STATE", str(tmp_path))
    decision = Decision(0.0, 1, 2, ScaleReason.UP, "peak utilisation 1.00 over 60 s, 1 replicas")
    scaling = AutoscaleRecord("step", 1, 3, decision.line(), 0.0)
    write_record(FleetRecord(1, "http://127.0.0.1:8000", 8000, 0.0, "/runs/x", (),
                             autoscale=scaling))  # fmt: skip
    (record,) = read_records()
    assert record.autoscale == scaling
    line = control.status_line(control.FleetStatus(record, True, (), None))
    assert line.splitlines()[-1].startswith(
        "autoscale: step between 1 and 3 replicas; last decision at "
    )
    assert line.endswith(": 1 -> 2 replicas (up: peak utilisation 1.00 over 60 s, 1 replicas)")


def test_the_gateway_view_reads_the_live_gateway_and_counts_its_arrivals() -> None:
    async def body() -> None:
        upstream = FakeUpstream("a")
        upstream.metrics_text = VLLM_METRICS
        await upstream.start()
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            view = GatewayView(gw)
            for _ in range(3):
                async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
            async with client.get(f"{url}/v1/models") as resp:
                assert resp.status == 200  # not a generation: not an arrival
            t0_s = float(int(time.monotonic())) + 0.2  # the gateway's clock
            view.count_arrivals(t0_s)
            completion = {"model": "m", "prompt": "once", "max_tokens": 3}
            async with client.post(f"{url}/v1/completions", json=completion) as resp:
                assert resp.status == 200
            view.count_arrivals(t0_s + 1)
            snap = view.snapshot(t0_s + 2, ("r9",))
        assert snap.arrivals_per_s[-2:] == (3.0, 1.0)
        a, starting = snap.replicas
        assert (a.replica_id, a.ready, a.running, a.waiting, a.kv_usage) == ("a", True, 5, 4, 0.5)
        assert 0.0 <= a.metrics_age_s < 10.0  # scraped when it was added
        assert (starting.replica_id, starting.ready) == ("r9", False)

    run(body())


def test_local_replicas_added_later_get_new_ids_and_a_slots_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[str] = []
    monkeypatch.setattr(ReplicaProcess, "start", lambda self: started.append(self.replica_id))
    monkeypatch.setattr(ReplicaProcess, "stop", lambda self, grace_s: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    scaling = {"enabled": True, "min_replicas": 1, "max_replicas": 3}
    config = parse_config({"engine": {"kind": "sim"}, "autoscale": scaling}, origin="t")
    replicas = LocalReplicas(config, SimModel("llama-3.1-8b", "m", None), tmp_path)
    assert replicas.core_slots() == [(0, 1), (2, 3), (4, 5)]  # a third of the cores each, not all
    replicas.launch(initial_replicas(config))
    first = replicas.launch_one()
    asyncio.run(replicas.stop_one("r1"))
    second = replicas.launch_one()
    assert started == ["r0", "r1", "r2"]  # an id is never given twice
    assert (first.replica_id, second.replica_id) == ("r1", "r2")
    assert [p.replica_id for p in replicas.processes] == ["r0", "r2"]
    assert second.log_path == tmp_path / "replica-r2.log"
    fixed = parse_config({"engine": {"kind": "sim"}, "replicas": {"count": 2}}, origin="t")
    assert LocalReplicas(fixed, SimModel("m", "m", None), tmp_path).core_slots() == [
        (0, 1, 2),
        (3, 4, 5),
    ]


def test_behind_a_warm_pool_the_fleets_policy_knows_its_pool_and_decides_every_second() -> None:
    from servepilot.fleet.autoscale.start import fleet_policy
    from servepilot.scaling.warm_pool import WAKE_S

    scaling = {"enabled": True, "min_replicas": 1, "max_replicas": 6, "interval_s": 5,
               "policy": "predictive", "replica_rps": 2.0}  # fmt: skip
    config = parse_config({"autoscale": scaling}, origin="t")
    pooled = fleet_policy(config, 40.0, pool_target=3)
    assert isinstance(pooled, PredictivePolicy)
    # Cold only what the pool cannot wake: the pool and its horizon, the wake plus a tick,
    # as `sim -c fleet.yaml` with the same pool builds it (sim/fleet/flags.py); behind a
    # pool the controller decides every second (pool_interval_s), not every interval_s.
    assert config.autoscale.tick_s(3) == 1.0 and config.autoscale.tick_s(0) == 5.0
    assert (pooled.sizing.pool, pooled.sizing.wake_horizon_s) == (3, WAKE_S + 1.0)
    assert pooled.sizing.horizon_s == 41.0
    plain = fleet_policy(config, 40.0, pool_target=0)
    assert isinstance(plain, PredictivePolicy)
    assert (plain.sizing.pool, plain.sizing.wake_horizon_s) == (0, None)
    assert plain.sizing.horizon_s == 45.0
    slower = parse_config({"autoscale": {**scaling, "pool_interval_s": 10}}, origin="t")
    assert slower.autoscale.tick_s(3) == 5.0  # never slower than interval_s
