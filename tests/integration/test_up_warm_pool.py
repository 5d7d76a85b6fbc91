"""`up` with a warm pool, on simulated replicas: replicas.asleep of them go to sleep once ready;
the gateway routes around them until `servepilot wake` brings one into rotation, and
`servepilot sleep` takes it out again. One fleet serves every test here (started once: a few
seconds); each test leaves it as it found it, r0 serving and r1 asleep."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.fleetproc import RunningFleet, cli, running_fleet

# Sleep and wake take this long on the simulated replicas (the defaults are an H200's).
SLEEP_FLAGS = ["--first-sleep-s", "0.5", "--sleep-s", "0.2", "--wake-s", "0.3"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    tmp = tmp_path_factory.mktemp("warm")
    fleet_yaml = tmp / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({
        "engine": {"kind": "sim", "sim_step_ms": 5, "sleep_mode": True,
                   "extra_args": SLEEP_FLAGS},
        "replicas": {"asleep": 1},
        "gateway": {"policy": "round_robin", "health_interval_s": 0.2},
    }))  # fmt: skip
    with running_fleet(tmp / "state", 2, ["-c", str(fleet_yaml)]) as running:
        yield running


def _post(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any], str]:
    """(status, JSON body, X-Servepilot-Replica) of a POST, errors included."""
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), resp.headers.get("X-Servepilot-Replica")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), ""


def _served_by(fleet: RunningFleet, count: int) -> list[str]:
    """Which replica answered each of `count` requests sent one after another."""
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answers = [_post(f"{fleet.url}/v1/chat/completions", chat) for _ in range(count)]
    assert all(status == 200 for status, _, _ in answers), answers
    return [replica for _, _, replica in answers]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))  # fmt: skip


def _states(fleet: RunningFleet) -> dict[str, str]:
    return {r["id"]: r["sleep"] for r in _get(f"{fleet.url}/admin/replicas")}


def _record_asleep(fleet: RunningFleet) -> dict[str, bool]:
    path = Path(fleet.env["SERVEPILOT_STATE"], "fleets", f"{fleet.port}.json")
    return {r["replica_id"]: r["asleep"] for r in json.loads(path.read_text())["replicas"]}


def _seconds(line: str) -> float:
    found = re.search(r"in (\d+\.\d+) s", line)
    assert found, line
    return float(found.group(1))


def test_up_holds_one_asleep_wake_spreads_and_sleep_takes_it_out(fleet: RunningFleet) -> None:
    port = ["--port", str(fleet.port)]
    assert re.search(r"replica r1 asleep in \d+\.\d s \(warm pool", fleet.log()), fleet.log()
    status = cli(["status", *port], fleet.env).stdout
    assert re.search(r"r1 .*asleep", status), status
    assert _record_asleep(fleet) == {"r0": False, "r1": True}
    # The gateway lists replicas in the order they joined (ready first, first listed).
    r1_url = next(r["url"] for r in _get(f"{fleet.url}/admin/replicas") if r["id"] == "r1")
    assert _get(f"{r1_url}/is_sleeping") == {"is_sleeping": True}
    r1_generated = _metric(r1_url, "vllm:generation_tokens_total")
    assert _served_by(fleet, 4) == ["r0"] * 4
    # Nothing reached the sleeping replica: the gateway sent it nothing, it generated nothing.
    assert _metric(fleet.url, 'servepilot_upstream_requests_total{class="1",replica="r1"') == 0
    assert _metric(r1_url, "vllm:generation_tokens_total") == r1_generated
    assert _metric(fleet.url, "servepilot_replicas_asleep") == 1
    assert _get(f"{fleet.url}/ready")["ready_replicas"] == 1

    woken = cli(["wake", "r1", *port], fleet.env)
    assert woken.returncode == 0, woken.stderr
    assert "replica r1 awake in" in woken.stdout
    assert 0.3 <= _seconds(woken.stdout) < 3  # the replica's --wake-s, measured
    assert _states(fleet) == {"r0": "awake", "r1": "awake"}
    assert _record_asleep(fleet) == {"r0": False, "r1": False}
    assert sorted(_served_by(fleet, 4)) == ["r0", "r0", "r1", "r1"]  # round robin over both
    assert _metric(fleet.url, "servepilot_replicas_asleep") == 0

    slept = cli(["sleep", "r1", *port], fleet.env)
    assert slept.returncode == 0, slept.stderr
    assert 0.2 <= _seconds(slept.stdout) < 3  # a later sleep: --sleep-s
    assert _states(fleet) == {"r0": "awake", "r1": "asleep"}
    assert _record_asleep(fleet) == {"r0": False, "r1": True}
    served_before = _metric(fleet.url, 'servepilot_upstream_requests_total{class="1",replica="r1"')
    assert _served_by(fleet, 4) == ["r0"] * 4
    after = _metric(fleet.url, 'servepilot_upstream_requests_total{class="1",replica="r1"')
    assert after == served_before
    assert "asleep" in cli(["top", *port], fleet.env).stdout


def test_the_admin_routes_refuse_what_cannot_be_done(fleet: RunningFleet) -> None:
    admin = f"{fleet.url}/admin/replicas"
    status, body, _ = _post(f"{admin}/r9/wake")
    assert (status, body["error"]["message"]) == (404, "no replica with id 'r9'")
    status, body, _ = _post(f"{admin}/r0/wake")
    assert (status, body["error"]["message"]) == (409, "replica r0 is awake, not asleep")
    status, body, _ = _post(f"{admin}/r0/sleep")
    assert status == 409
    assert body["error"]["message"] == "replica r0 is the last replica serving; wake another first"
    status, body, _ = _post(f"{admin}/r1/sleep")
    assert (status, body["error"]["message"]) == (409, "replica r1 is asleep, not awake")
    status, body, _ = _post(f"{admin}/r1/sleep?level=0")
    assert status == 400 and "`level`" in body["error"]["message"]
    status, body, _ = _post(f"{admin}/r1/nap")
    assert status == 404
    refused = cli(["wake", "r9", "--port", str(fleet.port)], fleet.env)
    assert refused.returncode == 1
    assert "no replica with id 'r9'" in refused.stderr
    assert _states(fleet) == {"r0": "awake", "r1": "asleep"}
