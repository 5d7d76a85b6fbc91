"""A real Prometheus scrapes a real fleet (`servepilot up`: the gateway and its replicas) on
loopback while traffic of every class runs, some of it queued and some shed; then every query
of the dashboard `servepilot observe render` writes for that fleet is run through Prometheus's
HTTP API: each must parse and return data (an empty panel is a failure), and the rendered
alert rules load in the server. The fast variant runs simulated replicas; the `vllm` one
queries the vLLM panels against the session's shared vLLM-CPU fleet of the embedded model."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from servepilot.core.config import FleetConfig
from servepilot.observe import alert_rules, dashboard
from tests.integration.fleetproc import Planned, RunningFleet, running_fleet
from tests.integration.prometheus_support import Prometheus, needs_prometheus, running_prometheus

# Long on the clock, light on the cores: handed out first (tests/integration/conftest.py).
pytestmark = [needs_prometheus, pytest.mark.starts_first]
KEY = "sk-ops"
# Two sequences a replica: a burst of 24 requests has 4 running, 6 queued at the gateway and
# the rest shed (queue_full), so the queue and shed panels have series too.
FLEET: dict[str, Any] = {
    "engine": {"max_num_seqs": 2},
    "gateway": {
        "auth": {"keys": [{"name": "ops", "key": KEY, "priority": 0}]},
        "admission": {"max_queued": 6},
    },
    "slo": {"ttft_p99_ms": 2000},
}
SIM = {"kind": "sim", "sim_step_ms": 20}


async def _one(session: aiohttp.ClientSession, url: str, model: str, cls_: int, key: bool) -> int:
    body = {"model": model, "stream": True, "max_tokens": 16,
            "messages": [{"role": "user", "content": f"count to ten, class {cls_}"}]}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}", "X-Priority": str(cls_)} if key else {}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def _traffic(
    url: str, model: str, bursts: int, size: int = 24, key: bool = True
) -> list[int]:
    statuses: list[int] = []
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(bursts):
            sent = (_one(session, url, model, i % 3, key) for i in range(size))
            statuses += await asyncio.gather(*sent)
            await asyncio.sleep(1.0)
    return statuses


def _fleet_and_dashboard(tmp_path: Path, replicas: int) -> None:
    # The autoscaler runs (its bounds hold the fleet where it is), so its panels are rendered.
    autoscale = {"enabled": True, "min_replicas": replicas, "max_replicas": replicas,
                 "interval_s": 1}  # fmt: skip
    settings = {**FLEET, "engine": {**FLEET["engine"], **SIM}, "autoscale": autoscale}
    config = FleetConfig.model_validate(settings)
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump(settings))
    rules = tmp_path / "alerts.yaml"
    rules.write_text(yaml.safe_dump(alert_rules(config)))
    with running_fleet(tmp_path / "state", replicas, ["-c", str(fleet_yaml)]) as fleet:
        jobs = {
            "servepilot": [fleet.url.removeprefix("http://")],
            "vllm": [r["url"].removeprefix("http://") for r in fleet.record["replicas"]],
        }
        with running_prometheus(tmp_path, jobs, [rules]) as prometheus:
            up = prometheus.wait_for_targets(replicas + 1)
            assert list(up.values()) == [1.0] * (replicas + 1), up
            statuses = asyncio.run(_traffic(fleet.url, "smollm2", bursts=3))
            assert 200 in statuses and 429 in statuses, statuses
            prometheus.wait_for_scrapes(3)
            _every_panel_has_data(prometheus, dashboard(config))
            _rules_loaded(prometheus, len(alert_rules(config)["groups"][0]["rules"]))


def _every_panel_has_data(prometheus: Prometheus, board: dict[str, Any]) -> None:
    empty, broken = [], []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            answer = prometheus.query(target["expr"])
            if answer["status"] != "success":
                broken.append((panel["title"], target["expr"], answer.get("error")))
            elif not answer["data"]["result"]:
                empty.append((panel["title"], target["expr"]))
    assert not broken, broken
    assert not empty, "panels without data: " + json.dumps(empty, indent=1)


def _rules_loaded(prometheus: Prometheus, count: int) -> None:
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/rules", timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == count
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]


def test_every_panel_has_data_on_a_sim_fleet(tmp_path: Path) -> None:
    _fleet_and_dashboard(tmp_path, replicas=2)


@pytest.mark.vllm
def test_every_vllm_panel_has_data_on_the_shared_vllm_fleet(
    vllm_fleet: RunningFleet, vllm_plan: Planned, tmp_path: Path
) -> None:
    """What only real vLLM can check: its metric names and labels, as the panels and the alert
    rules query them. The gateway's own panels (queue, sheds, autoscaler) are the sim
    variant's: the shared fleet has no autoscaler and sheds nothing."""
    config = FleetConfig.model_validate(yaml.safe_load(vllm_plan.fleet_yaml.read_text()))
    rules = tmp_path / "alerts.yaml"
    rules.write_text(yaml.safe_dump(alert_rules(config)))
    replicas = [r["url"].removeprefix("http://") for r in vllm_fleet.record["replicas"]]
    jobs = {"servepilot": [vllm_fleet.url.removeprefix("http://")], "vllm": replicas}
    board = dashboard(config)
    for panel in board["panels"]:
        panel["targets"] = [t for t in panel.get("targets", []) if "vllm:" in t["expr"]]
    assert sum(len(p["targets"]) for p in board["panels"]) >= 10  # the vLLM panels are there
    with running_prometheus(tmp_path, jobs, [rules]) as prometheus:
        up = prometheus.wait_for_targets(len(replicas) + 1)
        assert list(up.values()) == [1.0] * (len(replicas) + 1), up
        statuses = asyncio.run(_traffic(vllm_fleet.url, "smollm2", bursts=1, size=6, key=False))
        assert statuses == [200] * 6, statuses
        prometheus.wait_for_scrapes(3)
        _every_panel_has_data(prometheus, board)
        _rules_loaded(prometheus, len(alert_rules(config)["groups"][0]["rules"]))
