"""The gateway's latency histograms hold inference only: a load tester sizing its prompts
through /tokenize makes thousands of millisecond calls, which must neither drag the median
of `servepilot_e2e_seconds` down nor make doctor see a tail that is not there."""

from __future__ import annotations

import aiohttp

from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.latency_rules import p99_spikes
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    STREAM_CHAT,
    Scrape,
    call,
    chat,
    gateway_in_front_of,
    run,
    scrape,
)

TOKENIZE = {"model": "m", "prompt": "one two three"}
CHAT_ROUTE = {"route": "/v1/chat/completions", "class": "1"}


def _after_a_bench() -> str:
    """The gateway's /metrics after what `bench` does: many tokenizer calls, then generations
    that all take about as long (no tail)."""
    page: list[str] = []

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            for _ in range(150):
                assert (await call(client, url, TOKENIZE, path="/tokenize")).status == 200
            upstream.reply_delay_s = 0.06
            for index in range(24):
                reply = await call(client, url, STREAM_CHAT if index % 3 == 0 else chat("x"))
                assert reply.status == 200
            page.append((await scrape(client, url)).text)

    run(body(), timeout_s=30)
    return page[0]


def test_latency_histograms_count_inference_routes_only_by_route() -> None:
    metrics = Scrape(_after_a_bench())
    assert metrics.labelled("servepilot_e2e_seconds_count") == {frozenset(CHAT_ROUTE.items()): 24.0}
    assert metrics.labelled("servepilot_ttft_seconds_count") == {frozenset(CHAT_ROUTE.items()): 8.0}
    # The tokenizer calls are still answered and counted, as requests.
    tokenized = metrics.value("servepilot_requests_total", {"route": "/tokenize", "code": "200"})
    assert tokenized == 150


def test_doctor_sees_no_p99_spike_after_a_bench_sized_its_prompts() -> None:
    assert p99_spikes(Evidence(gateway_metrics=_after_a_bench())) == []
