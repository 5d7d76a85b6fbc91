"""The gateway under failure and load, with real processes and real HTTP on 127.0.0.1.

Replicas are the zero-cost streaming stub (benchmarks/stub_server.py, through
`gatewayproc.StubProcess`, which also counts what each stub received); vLLM is not started.

- a replica SIGKILLed under load: every request ends exactly once, cleanly;
- overload at 3x capacity: P0 keeps its latency, P2 is shed with 429 + Retry-After, no 5xx;
- 100k requests through a `servepilot gateway` process: memory stays flat, counters balance.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from servepilot.bench.client import Target
from servepilot.bench.records import RequestSpec
from servepilot.bench.runner import LoadOutcome, LoadPlan, run_load
from servepilot.core import loop
from servepilot.core.config import GatewayConfig, PolicyName
from servepilot.core.gateway_config import AdmissionConfig, ApiKey, AuthConfig, Priority
from servepilot.core.results import Load, LoadMode
from tests.integration.gatewayproc import (
    GatewayProcess,
    Metrics,
    StubProcess,
    ThreadedGateway,
    Upstream,
    openai_error,
)

MODEL = "stub-model"
REPLICA_HEADER = "X-Servepilot-Replica"
DONE = b"data: [DONE]"
TOKEN = b'"content":" tok"'


CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello"}],
    "stream": True,
    "max_tokens": 16,
}


@dataclass
class Result:
    """What one streamed request came to, as the client saw it."""

    index: int
    sent_s: float
    status: int = 0
    replica: str | None = None
    kind: str = "pending"
    """complete | interrupted | http_error | broken | hang"""
    detail: str = ""
    head_s: float | None = None
    """Seconds from send to the response head."""
    first_token_s: float | None = None
    """Seconds from send to the first content token."""
    end_s: float | None = None
    tokens: int = 0
    dones: int = 0
    error: dict[str, Any] = field(default_factory=dict)
    retry_after: str | None = None


def classify(result: Result, body: bytes, chunks: int) -> None:
    """Fill `result.kind` from a 200 stream's body: a complete stream (one [DONE], last, every
    token there), or an SSE error event ending it; anything else is broken."""
    events = [e for e in body.split(b"\n\n") if e.strip()]
    result.dones = sum(1 for e in events if e.strip() == DONE)
    result.tokens = sum(1 for e in events if TOKEN in e)
    errors = [e for e in events if e.startswith(b'data: {"error"')]
    if result.dones == 1 and events[-1].strip() == DONE and not errors and result.tokens == chunks:
        result.kind = "complete"
    elif result.dones == 0 and len(errors) == 1 and events[-1] is errors[0]:
        result.error = openai_error(errors[0][len(b"data: ") :])
        result.kind = "interrupted"
    else:
        tail = body[-300:]
        result.kind = "broken"
        result.detail = f"{len(events)} events, {result.dones} [DONE], tail {tail!r}"


async def stream_one(
    session: aiohttp.ClientSession,
    url: str,
    result: Result,
    chunks: int,
    *,
    priority: int | None = None,
    api_key: str | None = None,
    timeout_s: float = 20.0,
) -> Result:
    """Send one streamed chat request and record its single outcome (never raises)."""
    headers = {} if priority is None else {"X-Priority": str(priority)}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                f"{url}/v1/chat/completions", json=CHAT, headers=headers
            ) as resp:
                result.head_s = time.perf_counter() - started
                result.status = resp.status
                result.replica = resp.headers.get(REPLICA_HEADER)
                result.retry_after = resp.headers.get("Retry-After")
                if resp.status != 200:
                    result.error = openai_error(await resp.read())
                    result.kind = "http_error"
                    return result
                body = b""
                async for piece in resp.content.iter_any():
                    if result.first_token_s is None and TOKEN in body + piece:
                        result.first_token_s = time.perf_counter() - started
                    body += piece
                result.end_s = time.perf_counter() - started
                classify(result, body, chunks)
    except TimeoutError:
        result.kind, result.detail = "hang", f"no complete answer within {timeout_s} s"
    except (aiohttp.ClientError, AssertionError) as exc:
        result.kind, result.detail = "broken", f"{type(exc).__name__}: {exc}"
    return result


def settled(gw: GatewayProcess, timeout_s: float = 5.0) -> Metrics:
    """The gateway's metrics once nothing is in flight or queued any more (a response reaches
    the client a moment before the gateway releases its slot)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = gw.metrics()
        busy = metrics.value("servepilot_in_flight_requests") + metrics.value(
            "servepilot_queue_depth"
        )
        if busy == 0 or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


# --- 1. a replica SIGKILLed under load ---------------------------------------------------------

KILL_CHUNKS = 16
KILL_DELAY_MS = 20.0
KILL_REQUESTS = 200
KILL_SPACING_S = 0.005
KILL_AT_S = 0.5


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

                async def killer() -> None:
                    await asyncio.sleep(KILL_AT_S)
                    victim_count_before_kill.append(await asyncio.to_thread(victim.requests))
                    killed_at.append(time.perf_counter() - t0)
                    victim.kill()

                kill_task = asyncio.create_task(killer())
                tasks = []
                for i in range(KILL_REQUESTS):
                    delay = t0 + i * KILL_SPACING_S - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    result = Result(i, time.perf_counter() - t0)
                    tasks.append(
                        asyncio.create_task(stream_one(session, gw.url, result, KILL_CHUNKS))
                    )
                await kill_task
                return list(await asyncio.gather(*tasks))

        results = asyncio.run(drive())
        kinds = Counter(r.kind for r in results)
        bad = [r for r in results if r.kind not in ("complete", "interrupted")]
        assert not bad, f"{kinds}; first: {bad[:3]}"
        # Nobody got two endings, or a stream continued after its error.
        assert all(r.dones <= 1 for r in results)
        interrupted = [r for r in results if r.kind == "interrupted"]
        complete = [r for r in results if r.kind == "complete"]
        assert interrupted, "the kill hit no stream in flight: the test proved nothing"
        assert all(r.replica == dead for r in interrupted), interrupted[:3]
        assert all(r.error["code"] == "upstream_interrupted" for r in interrupted)
        # Whatever was sent after the kill was served, whole, by the survivor.
        after = [r for r in results if r.sent_s > killed_at[0] + 0.01]
        assert after and all(r.kind == "complete" and r.replica == alive for r in after)
        on_alive = sum(1 for r in complete if r.replica == alive)
        on_dead = sum(1 for r in complete if r.replica == dead)
        assert on_alive + on_dead + len(interrupted) == KILL_REQUESTS

        # The gateway's books, once its last releases have run.
        metrics = settled(gw)
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
        assert upstream.get((alive, "ok"), 0) == on_alive
        assert upstream.get((dead, "ok"), 0) == on_dead
        assert upstream.get((dead, "interrupted"), 0) == len(interrupted)
        assert upstream.get((dead, "failed"), 0) == retries
        assert {k for k, v in upstream.items() if v and k[0] == alive} == {(alive, "ok")}
        # The survivor received exactly the requests answered from it: a request that had
        # started streaming from the victim was never sent again.
        assert survivor.requests() == on_alive
        assert victim_count_before_kill[0] <= on_dead + len(interrupted) + retries
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
            f"{on_alive} on the survivor, {on_dead} whole from the victim, "
            f"{len(interrupted)} cut with an SSE error, {retries:.0f} retried"
        )
        assert gw.stop() == 0, gw.log()


# --- 2. overload at 3x capacity -----------------------------------------------------------------

OVERLOAD_CHUNKS = 10
OVERLOAD_DELAY_MS = 20.0
CAPACITY = 4
"""Requests in flight per replica (two replicas)."""
P2_BUDGET_MS = 250.0
OVERLOAD_S = 8.0
# Without API keys every caller is class P1 and X-Priority may only lower it (see
# tests/unit/test_gateway_admission.py::test_an_open_gateway_lets_x_priority_ask_for_p0), so
# the traffic comes with a P0 key, which X-Priority: 2 lowers to batch.
URGENT_KEY = "sk-urgent"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100.0
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def poisson_schedule(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    times, at = [], rng.expovariate(rate)
    while at < duration_s:
        times.append(at)
        at += rng.expovariate(rate)
    return times


def test_overload_at_three_times_capacity_sheds_p2_and_keeps_p0_fast() -> None:
    admission = AdmissionConfig(queue_budget_ms=(2_000.0, 10_000.0, P2_BUDGET_MS))
    auth = AuthConfig(keys=(ApiKey(name="urgent", key=URGENT_KEY, priority=Priority.P0),))
    config = GatewayConfig(
        port=0,
        policy=PolicyName.LEAST_LOAD,
        health_interval_s=0.5,
        admission=admission,
        auth=auth,
    )
    with (
        StubProcess(OVERLOAD_CHUNKS, OVERLOAD_DELAY_MS) as a,
        StubProcess(OVERLOAD_CHUNKS, OVERLOAD_DELAY_MS) as b,
        ThreadedGateway(
            config, [Upstream("a", a.url, CAPACITY), Upstream("b", b.url, CAPACITY)]
        ) as gw,
    ):

        async def drive() -> tuple[float, list[Result], list[Result]]:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                # The service time of one request, unloaded (this also opens connections).
                alone = [
                    await stream_one(
                        session, gw.url, Result(i, 0.0), OVERLOAD_CHUNKS, api_key=URGENT_KEY
                    )
                    for i in range(4)
                ]
                assert all(r.kind == "complete" for r in alone), alone
                service_s = statistics.median(r.end_s or 0.0 for r in alone)
                capacity_rps = 2 * CAPACITY / service_s
                rng = random.Random(7)
                arrivals = [(t, 0) for t in poisson_schedule(0.25 * capacity_rps, OVERLOAD_S, rng)]
                arrivals += [(t, 2) for t in poisson_schedule(3 * capacity_rps, OVERLOAD_S, rng)]
                arrivals.sort()
                tasks: list[tuple[int, asyncio.Task[Result]]] = []
                t0 = time.perf_counter()
                for i, (at, priority) in enumerate(arrivals):
                    delay = t0 + at - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    result = Result(i, at)
                    task = stream_one(
                        session,
                        gw.url,
                        result,
                        OVERLOAD_CHUNKS,
                        priority=priority,
                        api_key=URGENT_KEY,
                    )
                    tasks.append((priority, asyncio.create_task(task)))
                done = [(p, await t) for p, t in tasks]
                return (
                    service_s,
                    [r for p, r in done if p == 0],
                    [r for p, r in done if p == 2],
                )

        service_s, p0, p2 = asyncio.run(drive())
        capacity_rps = 2 * CAPACITY / service_s
        statuses = Counter(r.status for r in p0 + p2)
        assert all(s in (200, 429) for s in statuses), statuses  # never a 5xx
        assert not [r for r in p0 + p2 if r.kind in ("broken", "hang", "interrupted")]

        # P0: every request served, quickly. Its wait for a slot is at most one service time
        # (every slot frees within that; P0 goes first), plus the first token's delay.
        assert all(r.kind == "complete" for r in p0), Counter(r.status for r in p0)
        p0_ttft = [r.first_token_s or math.inf for r in p0]
        p0_head = [r.head_s or math.inf for r in p0]
        ttft_bound = service_s + 2 * OVERLOAD_DELAY_MS / 1000.0 + 0.15
        assert percentile(p0_ttft, 99) < ttft_bound, (sorted(p0_ttft)[-5:], ttft_bound)

        # P2: mostly refused, each refusal a 429 with Retry-After and an OpenAI body...
        shed = [r for r in p2 if r.status == 429]
        served = [r for r in p2 if r.kind == "complete"]
        shed_share = len(shed) / len(p2)
        assert shed_share > 0.5, (len(shed), len(p2))
        for r in shed:
            assert r.retry_after is not None and r.retry_after.isdigit(), r
            assert 1 <= int(r.retry_after) <= 60
            assert r.error["type"] == "rate_limit_error", r.error
            assert r.error["code"] in ("queue_budget", "hard_limit", "queue_full"), r.error
        # P0 goes first: it waits for a slot a fraction of what the P2 that got one waited.
        p2_head = [r.head_s or math.inf for r in served]
        assert percentile(p0_head, 50) < 0.5 * percentile(p2_head, 50), (
            percentile(p0_head, 50),
            percentile(p2_head, 50),
        )
        # ...but the replicas were kept busy, not starved by over-shedding.
        goodput = (len(served) + len(p0)) / OVERLOAD_S
        assert goodput > 0.6 * capacity_rps, (goodput, capacity_rps)
        # A refusal is quick: within the P2 budget (plus the 20 ms tick and scheduling slack).
        shed_wait = [r.head_s or math.inf for r in shed]
        assert percentile(shed_wait, 99) < P2_BUDGET_MS / 1000.0 + 0.25, sorted(shed_wait)[-5:]

        # The replicas never got more than their budget at once.
        for stub in (a, b):
            assert 0 < stub.metrics().value("stub_max_in_flight") <= CAPACITY
        stats = gw.inspect(
            lambda g: (g.pool.total_in_flight(), len(g.dispatcher.queue), g.metrics.sheds.copy())
        )
        assert stats[:2] == (0, 0)
        assert sum(v for (_, cls_), v in stats[2].items() if cls_ == "0") == 0
        metrics = Metrics.parse(gw.inspect(lambda g: g.metrics.render()).decode())
        # The gateway saw the classes the clients meant (the 4 unloaded requests were P0).
        e2e = metrics.by_label("servepilot_e2e_seconds_count", "class")
        assert e2e == {"0": len(p0) + 4, "2": len(served)}, e2e
        assert metrics.value("servepilot_shed_total", **{"class": "2"}) == len(shed)
        assert metrics.value("servepilot_requests_total", code="500") == 0
        print(
            f"\noverload: service {service_s * 1000:.0f} ms, capacity {capacity_rps:.1f} req/s, "
            f"P2 offered {len(p2) / OVERLOAD_S:.1f}/s: {shed_share:.0%} shed with 429, "
            f"{len(served) / OVERLOAD_S:.1f}/s served; P0 {len(p0)} requests: "
            f"TTFT p50 {percentile(p0_ttft, 50) * 1000:.0f} ms, "
            f"p99 {percentile(p0_ttft, 99) * 1000:.0f} ms (bound {ttft_bound * 1000:.0f}), "
            f"head p50 {percentile(p0_head, 50) * 1000:.0f} ms, "
            f"p99 {percentile(p0_head, 99) * 1000:.0f} ms; "
            f"P2 served head p50 {percentile(p2_head, 50) * 1000:.0f} ms, TTFT p50 "
            f"{percentile([r.first_token_s or math.inf for r in served], 50) * 1000:.0f} ms; "
            f"429 after p99 {percentile(shed_wait, 99) * 1000:.0f} ms"
        )


# --- 4. 100k requests: memory and counters ------------------------------------------------------

SOAK_CHUNKS = 1
SOAK_WARMUP = 10_000
SOAK_TOTAL = 100_000
SOAK_CONCURRENCY = 64
MAX_GROWTH_BYTES = 20 * 1024 * 1024
MAX_BYTES_PER_REQUEST = 200.0


def closed_loop(url: str, requests: int) -> LoadOutcome:
    """`requests` streamed chat requests, 64 at a time, with servepilot's bench client."""
    specs = [RequestSpec(i, f"{i}: hello there", SOAK_CHUNKS, 8) for i in range(1024)]
    plan = LoadPlan(
        Load(mode=LoadMode.CONCURRENCY, value=SOAK_CONCURRENCY),
        max_requests=requests,
        processes=1,
    )
    return loop.run(run_load(Target(url, MODEL, timeout_s=30.0), plan, specs))


def failures(outcome: LoadOutcome) -> Counter[str]:
    return Counter(f"{r.error}: {r.error_detail[:80]}" for r in outcome.records if not r.ok)


def test_100k_requests_leave_memory_flat_and_counters_balanced(tmp_path: Path) -> None:
    with (
        StubProcess(SOAK_CHUNKS) as a,
        StubProcess(SOAK_CHUNKS) as b,
        GatewayProcess([a.url, b.url], tmp_path, gateway={"health_interval_s": 0.5}) as gw,
    ):
        started = time.perf_counter()
        warm = closed_loop(gw.url, SOAK_WARMUP)
        assert not failures(warm)
        before = settled(gw)
        measured = closed_loop(gw.url, SOAK_TOTAL - SOAK_WARMUP)
        assert not failures(measured), failures(measured).most_common(5)
        elapsed = time.perf_counter() - started
        after = settled(gw)

        rss_before = before.value("process_resident_memory_bytes")
        rss_after = after.value("process_resident_memory_bytes")
        assert rss_before > 0
        growth = rss_after - rss_before
        per_request = growth / (SOAK_TOTAL - SOAK_WARMUP)
        print(
            f"\n100k: {SOAK_TOTAL} requests in {elapsed:.1f} s "
            f"({SOAK_TOTAL / elapsed:.0f}/s); gateway RSS {rss_before / 2**20:.1f} MiB after "
            f"{SOAK_WARMUP} -> {rss_after / 2**20:.1f} MiB after {SOAK_TOTAL}: "
            f"{growth / 2**20:+.2f} MiB, {per_request:+.1f} bytes/request"
        )
        assert growth < MAX_GROWTH_BYTES
        assert per_request < MAX_BYTES_PER_REQUEST

        # Every request counted once, answered 200, and nothing left in flight or queued.
        route = "/v1/chat/completions"
        assert after.value("servepilot_requests_total", route=route) == SOAK_TOTAL
        assert after.value("servepilot_requests_total", route=route, code="200") == SOAK_TOTAL
        assert after.by_label("servepilot_in_flight_requests", "replica") == {
            "r0": 0.0,
            "r1": 0.0,
        }
        assert after.by_label("servepilot_queue_depth", "class") == {
            "0": 0.0,
            "1": 0.0,
            "2": 0.0,
        }
        upstream = after.by_label("servepilot_upstream_requests_total", "result")
        assert upstream == {"ok": SOAK_TOTAL}, upstream
        assert after.value("servepilot_retries_total") == 0
        assert not after.has("servepilot_request_errors_total") or (
            after.value("servepilot_request_errors_total") == 0
        )
        # And the stubs received exactly as many: no request was sent twice or lost.
        per_stub = [a.requests(), b.requests()]
        assert sum(per_stub) == SOAK_TOTAL, per_stub
        assert abs(per_stub[0] - per_stub[1]) <= SOAK_CONCURRENCY  # round robin
        assert gw.stop() == 0, gw.log()
