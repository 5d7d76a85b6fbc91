"""A stream ends at its last event, `data: [DONE]`, whatever comes after it upstream.

vLLM writes `[DONE]` and the end of its chunked body separately, and the `openai` client closes
its connection once it has read `[DONE]`. The fake upstream's `end_gate` holds the end of the
body back, so that the client's close always comes first here: the order that, against real
vLLM, made about one stream in five count as a client disconnect (see
tests/integration/test_gateway_vllm_streams.py).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    STREAM_CHAT,
    gateway_in_front_of,
    reaches,
    read_event,
    run,
    scrape,
)

CHAT_ROUTE = {"route": "/v1/chat/completions"}
CHAT_200 = {**CHAT_ROUTE, "code": "200"}


@pytest.mark.parametrize("split_done", [False, True], ids=["done-in-one-read", "done-split"])
def test_a_stream_closed_by_its_client_after_done_is_a_completed_200(split_done: bool) -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        upstream.end_gate = asyncio.Event()
        upstream.split_done = split_done
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            for sent in (1, 2):
                resp = await client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT)
                assert b'"one"' in await read_event(resp)
                assert b'"two"' in await read_event(resp)
                assert await read_event(resp) == b"data: [DONE]\n\n"
                resp.close()  # as the openai client does on [DONE]
                await asyncio.sleep(0.05)  # the gateway sees the close before the replica's end
                upstream.end_gate.set()
                upstream.end_gate.clear()
                await asyncio.wait_for(reaches(lambda: upstream.streams_ended, sent)(), 1.0)
            metrics = await scrape(client, url)
        assert metrics.get("servepilot_requests_total", CHAT_200) == 2
        assert metrics.labelled("servepilot_request_errors_total") == {}
        upstream_results = {
            dict(labels)["result"]: value
            for labels, value in metrics.labelled("servepilot_upstream_requests_total").items()
        }
        assert upstream_results == {"ok": 2}
        assert metrics.get("servepilot_ttft_seconds_count", {**CHAT_ROUTE, "class": "1"}) == 2
        # The second exchange reused the first one's upstream connection.
        assert len(upstream.peers) == 1

    run(body())


def test_the_client_stream_ends_with_done_before_the_replica_body_does() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        upstream.end_gate = asyncio.Event()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                text = await asyncio.wait_for(resp.content.read(), 1.0)
                assert text.endswith(b"data: [DONE]\n\n")
                assert upstream.streams_ended == 0
            upstream.end_gate.set()
            await asyncio.wait_for(reaches(lambda: upstream.streams_ended, 1)(), 1.0)

    run(body())
