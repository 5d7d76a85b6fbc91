"""Non-streamed answers continued on another replica (continuation.whole_answers): asked of
the replica as a stream, answered whole. Fake replicas stream "one", then "two"."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import CHAT, gateway_in_front_of, run, scrape

WHOLE = {"continuation": {"whole_answers": True}}


async def _answer(client: aiohttp.ClientSession, url: str, doc: dict[str, Any]) -> Any:
    async with client.post(f"{url}/v1/chat/completions", json=doc) as resp:
        assert resp.status == 200 and resp.content_type == "application/json"
        return await resp.json()


@pytest.mark.parametrize(
    ("reason", "settings"),
    [("eof", {}), ("stall", {"stall_timeout_s": 0.2})],
)
def test_a_non_streamed_answer_broken_mid_generation_is_continued_and_answered_whole(
    reason: str, settings: dict[str, Any]
) -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        if reason == "eof":
            a.die_mid_stream = True  # a closes its connection after "one"
        else:
            a.gate = asyncio.Event()  # never set: a hangs after "one"
        config = {"continuation": {"whole_answers": True, **settings}}
        async with (
            gateway_in_front_of([a, b], health_interval_s=30, **config) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            answer = await _answer(client, url, CHAT)
            # a's "one", then b's answer to the chat continued from "one": "one", "two".
            assert answer["object"] == "chat.completion"
            message = answer["choices"][0]["message"]
            assert (message["role"], message["content"]) == ("assistant", "oneonetwo")
            (first,) = a.received
            assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
            (rest,) = b.received
            assert rest["stream"] is True and rest["continue_final_message"] is True
            assert rest["messages"][-1] == {"role": "assistant", "content": "one"}
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_stream_continuations_total", {"reason": reason}) == 1
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_an_unbroken_non_streamed_answer_is_the_stream_made_whole() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], **WHOLE) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            answer = await _answer(client, url, CHAT)
            assert answer["choices"][0]["message"]["content"] == "onetwo"
            metrics = await scrape(client, url)
            assert not any(n == "servepilot_stream_continuations_total" for n, _ in metrics.samples)

    run(body())


@pytest.mark.parametrize(
    ("doc", "settings"),
    [
        ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, WHOLE),
        ({**CHAT, "logprobs": True}, WHOLE),
        (CHAT, {}),  # whole_answers is off by default
        (CHAT, {"continuation": {"whole_answers": True, "enabled": False}}),
    ],
    ids=["tools", "logprobs", "default", "continuation-off"],
)
def test_other_non_streamed_requests_go_to_the_replica_as_they_came(
    doc: dict[str, Any], settings: dict[str, Any]
) -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], **settings) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            answer = await _answer(client, url, doc)
            assert answer["choices"][0]["message"]["content"] == "hello from a"
            assert a.received == [doc]

    run(body())


@pytest.mark.parametrize("opted_out", [False, True], ids=["continued", "opted-out"])
def test_a_replica_whose_engine_fails_mid_stream_hands_the_rest_to_another(
    opted_out: bool,
) -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.error_mid_stream = True  # "one", then vLLM's error event, [DONE], the body's end
        headers = {"X-Servepilot-Continue": "0"} if opted_out else {}
        async with (
            gateway_in_front_of([a, b], health_interval_s=30) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            doc = {**CHAT, "stream": True}
            async with client.post(f"{url}/v1/chat/completions", json=doc,
                                   headers=headers) as resp:  # fmt: skip
                raw = await resp.content.read()
            events = [json.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n")
                      if e and e != b"data: [DONE]"]  # fmt: skip
            if opted_out:  # the replica's error event and [DONE], as vLLM sends them
                assert "error" in events[-1] and raw.endswith(b"[DONE]\n\n")
                assert not b.received
                return
            assert [e["choices"][0]["delta"]["content"] for e in events] == ["one", "one", "two"]
            assert raw.endswith(b"data: [DONE]\n\n")
            metrics = await scrape(client, url)
            labels = {"reason": "error_event"}
            assert metrics.value("servepilot_stream_continuations_total", labels) == 1

    run(body())


def test_a_non_streamed_answer_whose_engine_fails_is_continued_too() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.error_mid_stream = True
        async with (
            gateway_in_front_of([a, b], health_interval_s=30, **WHOLE) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            answer = await _answer(client, url, CHAT)
            assert answer["choices"][0]["message"]["content"] == "oneonetwo"

    run(body())


def test_tokens_merged_into_one_event_are_counted_by_the_next_replicas_tokenizer() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.die_mid_stream = True
        a.first_text = "one two three"  # three tokens in one event (the fake: a word each)
        async with (
            gateway_in_front_of([a, b], health_interval_s=30) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            doc = {**CHAT, "stream": True, "max_tokens": 10}
            async with client.post(f"{url}/v1/chat/completions", json=doc) as resp:
                assert resp.status == 200
                await resp.content.read()
            (rest,) = b.received
            assert rest["max_tokens"] == 7 and b.tokenized == 1

    run(body())
