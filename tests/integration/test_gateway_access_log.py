"""The access log as users get it: `servepilot gateway --access-log PATH` in front of stub
replicas, and `servepilot up` writing access.log in its run folder; every line written by the
time the process has exited."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.integration.fleetproc import cli, down, running_fleet
from tests.integration.gatewayproc import GatewayProcess, StubProcess

REQUESTS = 12
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _post(url: str, doc: dict[str, Any]) -> tuple[int, str]:
    """(status, replica id) of a chat request, its body read whole."""
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()
        return resp.status, resp.headers["X-Servepilot-Replica"]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def test_gateway_access_log_flag_writes_a_line_per_request(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "access.log"
    held = {"access_log": {"flush_interval_ms": 3_600_000.0}}  # only the stop writes them
    with (
        StubProcess(chunks=4) as a,
        StubProcess(chunks=4) as b,
        GatewayProcess(
            [a.url, b.url], tmp_path, gateway=held, extra=["--access-log", str(path)]
        ) as gateway,
    ):
        answers = [_post(gateway.url, CHAT) for _ in range(REQUESTS)]
        assert gateway.stop() == 0
    lines = [line for line in _lines(path) if line["path"] == "/v1/chat/completions"]
    assert [(line["status"], line["replica"]) for line in lines] == answers
    assert {replica for _, replica in answers} == {"r0", "r1"}
    assert all(line["stream"] and line["ttft_ms"] > 0 for line in lines)


def test_up_writes_access_log_next_to_gateway_log(tmp_path: Path) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({"engine": {"kind": "sim", "sim_step_ms": 1}}))
    with running_fleet(tmp_path / "state", 1, ["-c", str(fleet_yaml)]) as fleet:
        run_dir = Path(fleet.record["run_dir"])
        with urllib.request.urlopen(f"{fleet.url}/v1/models", timeout=10) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        short = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answers = [_post(fleet.url, short) for _ in range(3)]
        down(fleet, timeout_s=60)
    assert (run_dir / "gateway.log").is_file()
    lines = [line for line in _lines(run_dir / "access.log") if line["method"] == "POST"]
    assert [(line["status"], line["replica"]) for line in lines] == answers == [(200, "r0")] * 3
    assert all(line["output_tokens"] == 2 for line in lines)
    shown = cli(["logs", "access"], fleet.env)  # the last run's, once the fleet is gone
    assert shown.returncode == 0 and shown.stdout == (run_dir / "access.log").read_text()
