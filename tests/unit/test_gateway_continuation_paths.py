"""Stream continuation end to end, in one gateway: a replica that dies, hangs or leaves the
rotation mid-answer hands the rest to another; a stall takes its replica out of rotation; a
stream with no other replica in rotation waits for one (continuation.replica_wait_s).

Replicas are chosen round robin (in id order), so which replica gets each request is known
in advance.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    STREAM_CHAT,
    eventually,
    gateway_in_front_of,
    read_event,
    run,
    scrape,
    until,
)


def test_a_replica_dying_mid_stream_hands_the_rest_of_the_answer_to_another() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.die_mid_stream = True
        async with (
            gateway_in_front_of([a, b], health_interval_s=30) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.status == 200 and resp.headers["X-Servepilot-Replica"] == "a"
                raw = await resp.content.read()
            events = [e for e in raw.split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]" and raw.count(b"[DONE]") == 1
            docs = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
            # a's "one", then b's answer to the chat continued from "one".
            assert [d["choices"][0]["delta"]["content"] for d in docs] == ["one", "one", "two"]
            (asked,) = b.received
            assert asked["messages"][-1] == {"role": "assistant", "content": "one"}
            assert asked["continue_final_message"] is True
            assert asked["add_generation_prompt"] is False
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_stream_continuations_total", {"reason": "eof"}) == 1
            assert not any(name == "servepilot_request_errors_total" for name, _ in metrics.samples)
            assert gw.pool.total_in_flight() == 0

    run(body())


@pytest.mark.parametrize(
    ("reason", "settings"),
    [
        # a hangs after its first token: found stalled after 0.2 s of nothing.
        ("stall", {"continuation": {"stall_timeout_s": 0.2}}),
        # a hangs and fails its health checks: out of rotation long before a stall.
        ("out_of_rotation", {"health_interval_s": 0.05}),
    ],
)
def test_a_replica_that_hangs_mid_stream_hands_the_rest_to_another(
    reason: str, settings: dict[str, Any]
) -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.gate = asyncio.Event()  # never set: a's second chunk never comes
        async with (
            gateway_in_front_of([a, b], **{"health_interval_s": 30, **settings}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.headers["X-Servepilot-Replica"] == "a"
                first = await read_event(resp)
                if reason == "out_of_rotation":
                    a.health_status = 500
                raw = first + await asyncio.wait_for(resp.content.read(), 10)
            events = [e for e in raw.split(b"\n\n") if e]
            docs = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
            assert [d["choices"][0]["delta"]["content"] for d in docs] == ["one", "one", "two"]
            assert events[-1] == b"data: [DONE]"
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_stream_continuations_total", {"reason": reason}) == 1
            assert gw.pool.total_in_flight() == 0
        a.gate.set()

    run(body())


def test_a_stall_takes_its_replica_out_at_once_and_its_unanswered_streams_go_elsewhere() -> None:
    """A hung replica: one stream mid-answer stalls (0.2 s here), and that is enough to know
    the engine makes no step. The replica leaves the rotation then, not at its health checks
    (every 30 s here), and a stream it had not yet answered goes to the other replica."""

    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.gate = asyncio.Event()  # never set: a's second chunk never comes
        settings = {"health_interval_s": 30, "continuation": {"stall_timeout_s": 0.2}}
        async with (
            gateway_in_front_of([a, b], **settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.headers["X-Servepilot-Replica"] == "a"
                first = await read_event(resp)
                # b's turn, then a's again: held by a before its head, as a hung engine does.
                async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as other:
                    assert other.headers["X-Servepilot-Replica"] == "b"
                    await other.read()
                a.hold_requests = True
                waiting = asyncio.ensure_future(
                    client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT)
                )
                await eventually(until(lambda: a.holding == 1))
                raw = first + await asyncio.wait_for(resp.content.read(), 10)
            assert raw.endswith(b"data: [DONE]\n\n")
            async with await asyncio.wait_for(waiting, 5) as late:
                body_bytes = await late.read()
            assert late.status == 200 and body_bytes.endswith(b"data: [DONE]\n\n")
            assert not gw.pool.get("a").healthy  # out until a health check passes
            assert len(b.received) == 3  # the other stream, the rest of the stalled one, the late
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_stream_continuations_total", {"reason": "stall"}) == 1
            assert gw.pool.total_in_flight() == 0
        a.gate.set()
        a.release_all()

    run(body())


def test_a_stream_with_no_other_replica_in_rotation_waits_for_one_to_come_back() -> None:
    """a dies mid-answer while b is still down (failing its checks: a restart): the stream
    pauses until b passes a check, then goes on from b, within continuation.replica_wait_s."""

    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.gate = asyncio.Event()
        b.health_status = 500
        settings = {"health_interval_s": 0.05, "continuation": {"replica_wait_s": 10}}
        async with (
            gateway_in_front_of([a, b], **settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await eventually(until(lambda: not gw.pool.get("b").healthy))
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.headers["X-Servepilot-Replica"] == "a"
                first = await read_event(resp)
                a.die_mid_stream = True
                a.gate.set()
                await asyncio.sleep(0.5)  # the stream waits: b is down
                assert b.received == []
                b.health_status = 200  # b is back
                raw = first + await asyncio.wait_for(resp.content.read(), 10)
            events = [e for e in raw.split(b"\n\n") if e]
            docs = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
            assert [d["choices"][0]["delta"]["content"] for d in docs] == ["one", "one", "two"]
            assert events[-1] == b"data: [DONE]" and len(b.received) == 1
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_stream_continuations_total", {"reason": "eof"}) == 1
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_a_stream_that_waited_for_a_replica_in_vain_ends_with_the_error_event() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        a.die_mid_stream = True
        settings = {"continuation": {"replica_wait_s": 0.6}}
        async with (
            gateway_in_front_of([a], **settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            started = asyncio.get_running_loop().time()
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                raw = await asyncio.wait_for(resp.content.read(), 10)
            waited_s = asyncio.get_running_loop().time() - started
            assert 0.5 <= waited_s < 5, waited_s
            assert b"no other healthy replica" in raw and b"[DONE]" not in raw
            assert gw.pool.total_in_flight() == 0

    run(body())


@pytest.mark.parametrize("answered_head", [False, True], ids=["before-head", "after-head"])
def test_a_stream_waiting_for_its_first_token_on_a_replica_out_of_rotation_goes_elsewhere(
    answered_head: bool,
) -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        if answered_head:
            a.first_gate = asyncio.Event()  # never set: a's head came, its first token never
        else:
            a.reply_delay_s = 60.0  # a hangs before its head
        async with (
            gateway_in_front_of([a, b], health_interval_s=0.05) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            sent = asyncio.ensure_future(client.post(f"{url}/v1/chat/completions",
                                                     json=STREAM_CHAT))  # fmt: skip
            await eventually(until(lambda: len(a.received) == 1))
            a.health_status = 500
            async with await sent as resp:
                raw = await asyncio.wait_for(resp.content.read(), 10)
            events = [e for e in raw.split(b"\n\n") if e]
            docs = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
            assert [d["choices"][0]["delta"]["content"] for d in docs] == ["one", "two"]
            assert events[-1] == b"data: [DONE]" and len(b.received) == 1
            assert gw.pool.total_in_flight() == 0
        if a.first_gate is not None:
            a.first_gate.set()

    run(body())


def test_the_wait_for_a_replica_lasts_its_whole_limit_on_a_busy_loop() -> None:
    from servepilot.gateway.continuation.edge import _Wait

    async def body() -> float:
        loop = asyncio.get_running_loop()
        wait, started = _Wait(0.6), loop.time()
        while await wait.tick():
            time.sleep(0.1)  # noqa: ASYNC251 (a busy loop: every tick wakes 0.1 s late)
        return loop.time() - started

    # Giving up once a whole 0.25 s tick no longer fit ended this wait after 0.35 s.
    assert 0.6 <= asyncio.run(body()) < 0.9
