"""A replica SIGKILLed under load, with real processes and real HTTP on 127.0.0.1: every
request ends exactly once, cleanly.

Replicas are the zero-cost streaming stub (tests/support/stub_server.py, through
`gatewayproc.StubProcess`, which also counts what each stub received); vLLM is not started.
Overload is test_gateway_overload.py; the 100k-request soak test_gateway_soak.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.integration.gatewayproc import GatewayProcess, StubProcess
from tests.integration.streaming_client import (
    MODEL,
    REPLICA_HEADER,
    Result,
    stream_one,
)

# --- 1. a replica SIGKILLed under load ---------------------------------------------------------

KILL_CHUNKS = 16
KILL_DELAY_MS = 20.0
KILL_REQUESTS = 200
KILL_SPACING_S = 0.005
KILL_AT_REQUEST = KILL_REQUESTS // 2
AFTER_KILL_MARGIN_S = 0.01


@pytest.mark.parametrize(
    "protection",
    [
        pytest.param({}, id="default-breaker"),
        # A breaker that never opens and slow health checks: what takes the dead replica out
        # is the failed connections themselves, so requests sent to it are retried.
        pytest.param({"breaker_failures": 10_000}, id="retry-path"),
    ],
)
def test_replica_killed_under_load_every_request_ends_once(
    tmp_path: Path, protection: dict[str, Any]
) -> None:
    settings = {
        "health_interval_s": 2.0 if protection else 0.5,
        "unhealthy_after": 3,
        "protection": protection,
    }
    with (
        StubProcess(KILL_CHUNKS, KILL_DELAY_MS) as survivor,
        StubProcess(KILL_CHUNKS, KILL_DELAY_MS) as victim,
        GatewayProcess([survivor.url, victim.url], tmp_path, gateway=settings) as gw,
    ):
        # `servepilot gateway` names its replicas r0, r1... in --replica order.
        alive, dead = "r0", "r1"
        killed_at: list[float] = []
        victim_count_before_kill: list[int] = []

        async def drive() -> list[Result]:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                t0 = time.perf_counter()
                # The kill happens in the send loop, halfway, and the schedule starts again
                # after it: however late a busy loop makes it, half the requests go after it.
                base = t0
                tasks = []
                for i in range(KILL_REQUESTS):
                    if i == KILL_AT_REQUEST:
                        victim_count_before_kill.append(await asyncio.to_thread(victim.requests))
                        killed_at.append(time.perf_counter() - t0)
                        victim.kill()
                        base = time.perf_counter() + 2 * AFTER_KILL_MARGIN_S - i * KILL_SPACING_S
                    delay = base + i * KILL_SPACING_S - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    result = Result(i, time.perf_counter() - t0)
                    tasks.append(
                        asyncio.create_task(stream_one(session, gw.url, result, KILL_CHUNKS))
                    )
                return list(await asyncio.gather(*tasks))

        results = asyncio.run(drive())
        kinds = Counter(r.kind for r in results)
        # Streams the kill broke mid-answer went on from the survivor (stream continuation):
        # every request is one whole answer.
        bad = [r for r in results if r.kind != "complete"]
        assert not bad, f"{kinds}; first: {bad[:3]}"
        assert all(r.dones == 1 for r in results)
        complete = results
        # Whatever was sent after the kill was served, whole, by the survivor.
        after = [r for r in results if r.sent_s > killed_at[0] + AFTER_KILL_MARGIN_S]
        assert after and all(r.kind == "complete" and r.replica == alive for r in after)
        on_alive = sum(1 for r in complete if r.replica == alive)
        on_dead = sum(1 for r in complete if r.replica == dead)
        assert on_alive + on_dead == KILL_REQUESTS

        # The gateway's books, once its last releases have run.
        metrics = gw.settled_metrics()
        assert metrics.by_label("servepilot_in_flight_requests", "replica") == {
            alive: 0.0,
            dead: 0.0,
        }
        assert metrics.value("servepilot_queue_depth") == 0
        upstream = {
            (s[1]["replica"], s[1]["result"]): s[2]
            for s in metrics.samples
            if s[0] == "servepilot_upstream_requests_total"
        }
        retries = metrics.value("servepilot_retries_total")
        continued = metrics.value("servepilot_stream_continuations_total")
        assert continued >= 1, "the kill hit no stream in flight: the test proved nothing"
        # The continued streams began on the dead replica and ended on the survivor.
        assert upstream.get((alive, "ok"), 0) == on_alive + continued
        assert upstream.get((dead, "ok"), 0) == on_dead - continued
        assert upstream.get((dead, "interrupted"), 0) == continued
        assert upstream.get((dead, "failed"), 0) == retries
        assert {k for k, v in upstream.items() if v and k[0] == alive} == {(alive, "ok")}
        # The survivor received exactly the requests answered from it and the continuations
        # of those broken on the victim.
        assert survivor.requests() == on_alive + continued
        assert victim_count_before_kill[0] <= on_dead + retries
        assert (
            metrics.value("servepilot_requests_total", route="/v1/chat/completions")
            == metrics.value("servepilot_requests_total", route="/v1/chat/completions", code="200")
            == KILL_REQUESTS
        )
        if protection:  # the retry path: requests sent to the dead replica went elsewhere
            assert retries >= 1
        # The dead replica is out of rotation: unhealthy, or behind an open breaker.
        out = (
            metrics.value("servepilot_replica_healthy", replica=dead) == 0
            or metrics.value("servepilot_breaker_state", replica=dead) == 2
        )
        assert out and metrics.value("servepilot_replica_healthy", replica=alive) == 1

        # Still serving, on the survivor, through the official client.
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0)
        for _ in range(4):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "again"}], stream=True
            )
            assert raw.headers[REPLICA_HEADER] == alive
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            assert text == " tok" * KILL_CHUNKS
        assert gw.metrics().value("servepilot_in_flight_requests") == 0
        print(
            f"\nkill -9 ({'retry path' if protection else 'default breaker'}): {kinds}, "
            f"{on_alive} on the survivor, {on_dead} from the victim ({continued:.0f} of them "
            f"continued on the survivor), {retries:.0f} retried"
        )
        assert gw.stop() == 0, gw.log()
