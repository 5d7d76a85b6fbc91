"""100k requests through a `servepilot gateway` process in front of two streaming stubs
(tests/support/stub_server.py, through `gatewayproc.StubProcess`), with servepilot's own bench
client on 127.0.0.1: the gateway's memory stays flat and every counter balances."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from servepilot.bench.client import Target
from servepilot.bench.records import RequestSpec
from servepilot.bench.runner import LoadOutcome, LoadPlan, run_load
from servepilot.core import loop
from servepilot.core.results import Load, LoadMode
from tests.integration.gatewayproc import GatewayProcess, StubProcess

MODEL = "stub-model"

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
        before = gw.settled_metrics()
        measured = closed_loop(gw.url, SOAK_TOTAL - SOAK_WARMUP)
        assert not failures(measured), failures(measured).most_common(5)
        elapsed = time.perf_counter() - started
        after = gw.settled_metrics()

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
