"""The exact prefix index against real vLLM-CPU replicas (the shared fleet, which `up` starts
with --kv-events-config): the gateway follows every replica's KV events, and the tokens it
predicts a repeated prompt finds cached are the tokens vLLM reports it reused."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from tests.integration.fleetproc import RunningFleet
from tests.integration.gatewayproc import scrape

pytestmark = pytest.mark.vllm

MODEL = "smollm2"
PREDICTED = "servepilot_routing_stat"
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


def test_predicted_cached_tokens_match_what_vllm_reused(vllm_fleet: RunningFleet) -> None:
    urls = {r["replica_id"]: r["url"] for r in vllm_fleet.record["replicas"]}
    # About 1,500 tokens, new to the fleet: 11 full 128-token blocks reusable on a repeat.
    prompt = f"{time.time_ns()} " + " ".join(f"item {i} is {i * 7 % 13};" for i in range(300))
    first = _chat(vllm_fleet.url, prompt)
    time.sleep(1.0)  # the replica's BlockStored events reach the gateway
    predicted_before = scrape(vllm_fleet.url).value(PREDICTED, stat="exact_cached_tokens_predicted")
    hits_before = scrape(urls[first]).value(VLLM_HITS)
    second = _chat(vllm_fleet.url, prompt)
    predicted = (
        scrape(vllm_fleet.url).value(PREDICTED, stat="exact_cached_tokens_predicted")
        - predicted_before
    )
    assert second == first  # where its prefix is
    reused = scrape(urls[second]).value(VLLM_HITS) - hits_before
    assert reused >= 1024, reused
    assert abs(predicted - reused) <= 0.05 * reused, (predicted, reused)
