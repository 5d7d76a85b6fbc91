"""A fleet whose replicas are still loading is a fleet: `status` shows it, `down` stops it.

The simulated replicas are made slow to start by a `sitecustomize` that sleeps before the
replica's own code runs (what vLLM's ~40 s of model loading looks like from outside), so the
fleet stays `starting` for the whole test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.fleetproc import (
    RunningFleet,
    cli,
    free_port,
    running_fleet,
    vllm_processes_in_group,
)

REPLICAS = 2
LOAD_S = 120


@pytest.fixture
def starting(tmp_path: Path) -> Iterator[RunningFleet]:
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(f"import time\ntime.sleep({LOAD_S})\n")
    pythonpath = os.pathsep.join(filter(None, [str(slow), os.environ.get("PYTHONPATH")]))
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(
        yaml.safe_dump(
            {"engine": {"kind": "sim", "sim_step_ms": 10, "env": {"PYTHONPATH": pythonpath}}}
        )
    )
    extra = ["-c", str(fleet_yaml)]
    with running_fleet(tmp_path / "state", REPLICAS, extra, until="starting") as fleet:
        yield fleet


def test_status_shows_a_starting_fleet_and_the_replicas_it_waits_for(
    starting: RunningFleet,
) -> None:
    done = cli(["status"], starting.env)
    assert done.returncode == 0, done.stderr
    assert (
        f"fleet on port {starting.port}: starting (0 of 2 replicas ready; waiting for r0, r1)"
        in done.stdout
    )
    assert f"logs: {starting.record['run_dir']}" in done.stdout


def test_status_of_another_port_names_the_running_fleet(starting: RunningFleet) -> None:
    other = free_port()
    done = cli(["status", "--port", str(other)], starting.env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        done.stderr.split()
        == (
            f"error: no fleet on port {other}; a fleet runs on port {starting.port} "
            "hint: see `servepilot status`"
        ).split()
    )
    top = cli(["top", "--port", str(starting.port)], starting.env)
    assert top.returncode == 1, top.stdout + top.stderr
    assert f"error: the fleet on port {starting.port} is still starting" in top.stderr


def test_down_stops_a_starting_fleet_and_leaves_nothing_behind(starting: RunningFleet) -> None:
    groups = list(starting.replica_pids().values())
    assert len(groups) == REPLICAS and all(vllm_processes_in_group(g) for g in groups)
    done = cli(["down", "--port", str(starting.port)], starting.env, timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"fleet on port {starting.port} stopped" in done.stdout + done.stderr
    assert starting.proc.wait(timeout=30) == 0
    assert all(vllm_processes_in_group(g) == [] for g in groups)
    state = Path(starting.env["SERVEPILOT_STATE"])
    assert not (state / "fleets" / f"{starting.port}.json").exists()
    assert "stopped" in starting.log()
    assert "serving" not in cli(["status"], starting.env).stdout
