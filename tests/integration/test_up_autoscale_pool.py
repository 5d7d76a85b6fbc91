"""`up --autoscale 1:2` with a warm pool of one parked replica (replicas.asleep: 1 on CPU,
where there is no sleep mode): a load ramp sent with the official `openai` client un-parks
r1 (no cold start on the ramp's path), the pool is refilled behind it (r2 starts cold and is
parked once it serves), the load ends and the fleet goes back down to one replica serving
with one in the pool, without a failed request. Simulated replicas run in every suite; the
vLLM-CPU variant is marked `vllm` and `slow` (SERVEPILOT_SLOW_TESTS=1), the one on a local
Ray cluster (simulated replicas as actors, the pool parked through their URLs) `ray` and
`slow`."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.integration.fleetproc import RunningFleet, cli, down, running_fleet, wait_until

# The step rules on a short clock (test_up_autoscale.py's), with no second step up.
RULES = {"interval_s": 1, "window_s": 3, "up_cooldown_s": 600, "down_cooldown_s": 3}
ENGINES = {
    "sim": {"kind": "sim", "sim_step_ms": 20, "max_num_seqs": 4},
    "vllm": {"max_num_seqs": 4},
}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _logs(fleet: RunningFleet) -> str:
    """`up`'s output and the gateway's log (the controller's lines)."""
    return cli(["logs", "gateway", "--port", str(fleet.port)], fleet.env).stdout + fleet.log()


def _at(logs: str, line: str) -> float:
    """The time of the gateway log's first line that says `line` (seconds of the day)."""
    found = re.search(r"^\S+ (\d\d):(\d\d):(\d\d),(\d{3}) .*" + re.escape(line), logs, re.M)
    assert found is not None, f"{line!r} not in {logs}"
    h, m, sec, ms = (int(x) for x in found.groups())
    return 3600 * h + 60 * m + sec + ms / 1000


def _states(fleet: RunningFleet) -> dict[str, str]:
    return {r["id"]: r["sleep"] for r in _get(f"{fleet.url}/admin/replicas")}


class Ramp:
    """Requests from `workers` threads of the official client until `stop`; every answer and
    every failure counted (max_retries=0: a failure is not hidden by a retry)."""

    def __init__(self, fleet: RunningFleet, workers: int, max_tokens: int) -> None:
        self._client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="unused",
                                     max_retries=0, timeout=300)  # fmt: skip
        self._max_tokens = max_tokens
        self.stop = threading.Event()
        self.done = 0
        self.failures: list[str] = []
        self._pool = ThreadPoolExecutor(workers)
        self._futures = [self._pool.submit(self._loop) for _ in range(workers)]

    def _loop(self) -> None:
        model = self._client.models.list().data[0].id
        while not self.stop.is_set():
            try:
                answer = self._client.chat.completions.create(
                    model=model, max_tokens=self._max_tokens,
                    messages=[{"role": "user", "content": "Count to twenty."}],
                )  # fmt: skip
                assert answer.choices[0].message.content is not None
                self.done += 1
            except Exception as exc:  # every failure is the test's to report
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def end(self) -> None:
        self.stop.set()
        for future in self._futures:
            future.result(timeout=300)
        self._pool.shutdown()


ON_RAY = pytest.param("ray", marks=[
    pytest.mark.ray, pytest.mark.slow(reason="a minute on its own Ray cluster; the same "
                                      "controller and gateway run in the sim variant"),
])  # fmt: skip


ON_VLLM = pytest.param("vllm", marks=[
    pytest.mark.vllm, pytest.mark.slow(reason="three vLLM-CPU replicas of its own (a refill "
                                       "starts cold under the ramp's load: minutes); the same "
                                       "controller and gateway run in the sim variant"),
])  # fmt: skip


@pytest.fixture(params=["sim", ON_VLLM, ON_RAY])
def pooled_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningFleet]:
    doc: dict[str, Any] = {
        "engine": ENGINES["vllm" if request.param == "vllm" else "sim"],
        "replicas": {"asleep": 1},
        "gateway": {"health_interval_s": 0.5},
        "autoscale": RULES,
    }
    if request.param == "ray":
        cluster = request.getfixturevalue("cluster")
        doc["cluster"] = {"backend": "ray", "address": cluster.address, "placement_timeout_s": 30}
        doc["model"] = {"source": "llama-3.1-8b"}  # as test_ray_autoscale.py: a preset's config
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump(doc))
    extra = ["-c", str(fleet_yaml), "--autoscale", "1:2"]
    with running_fleet(tmp_path / "state", 2, extra) as fleet:
        yield fleet


def test_a_ramp_unparks_the_pool_refills_it_and_the_fleet_goes_back_down(
    pooled_fleet: RunningFleet,
) -> None:
    fleet = pooled_fleet
    assert _states(fleet) == {"r0": "awake", "r1": "parked"}
    assert "replica r1 parked (warm pool" in fleet.log()
    status = cli(["status"], fleet.env).stdout
    assert "replicas: 1 serving; warm pool: 1 parked (loaded and running" in status
    # The ramp: 1 request, then 6 at a time (r0 has room for 4): r1 is un-parked.
    light = Ramp(fleet, 1, 16)
    busy = Ramp(fleet, 5, 16)
    woken_at_s = time.monotonic()
    assert wait_until(lambda: _states(fleet).get("r1") == "awake", 120), _logs(fleet)
    took_s = time.monotonic() - woken_at_s
    assert "autoscale: 1 -> 2 replicas (up: peak utilisation" in fleet.log()
    # The pool is refilled behind it: r2 starts cold, serves, and is parked.
    assert wait_until(lambda: _states(fleet).get("r2") == "parked", 480), _logs(fleet)
    busy.end()

    # Back to one in flight: the newest to join of r0 and r1 leaves (the pool is full:
    # drained and stopped), r2 stays parked.
    def back_down() -> bool:
        states = _states(fleet)
        return states.pop("r2") == "parked" and list(states.values()) == ["awake"]

    assert wait_until(back_down, 120), (_states(fleet), _logs(fleet))
    light.end()
    assert busy.failures == [] and light.failures == []
    assert busy.done > 0 and light.done > 0
    logs = _logs(fleet)
    wake = re.search(r"replica r1 woken from the warm pool in ([\d.]+) s", logs)
    assert wake is not None, logs
    cold_s = _at(logs, "replica r2 added") - _at(logs, "replica r2 launched")
    # For the record (pytest -s): the pool's wake against the refill's cold start.
    print(f"\nr1 un-parked in {float(wake.group(1)):.3f} s (in rotation {took_s:.1f} s into "
          f"the ramp); r2 cold start {cold_s:.1f} s (launch to in the gateway); "
          f"{busy.done + light.done} requests, 0 failed")  # fmt: skip
    assert "replica r2 launched to refill the warm pool" in logs
    assert "replica r1 launched" not in logs  # no cold start on the ramp's path
    with urllib.request.urlopen(f"{fleet.url}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert 'servepilot_autoscale_replica_starts_total{how="wake"} 1.0' in metrics
    assert 'servepilot_autoscale_replica_starts_total{how="cold"} 1.0' in metrics
    assert "servepilot_replicas_parked 1.0" in metrics
    down(fleet, timeout_s=120)
