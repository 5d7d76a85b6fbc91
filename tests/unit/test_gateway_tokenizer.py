"""Tokenizer calls through the gateway: they reach a replica even when admission would make
a generation wait or refuse it, and they leave no count behind."""

from __future__ import annotations

import aiohttp

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    call,
    chat,
    content_of,
    eventually,
    gateway_in_front_of,
    in_background,
    queued,
    run,
    scrape,
    until,
)

TOKENIZE = {"model": "m", "prompt": "one two three"}


def test_a_tokenizer_call_is_answered_while_generations_wait_for_a_full_replica() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of([upstream], admission={"max_queued": 1}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            blocker = in_background(client, url, chat("blocker"))
            await eventually(until(lambda: upstream.holding == 1))
            waiting = in_background(client, url, chat("waiting"))
            await eventually(queued(gw, 1))
            # The replica's one slot is taken and the queue is full: a generation now gets
            # 429, a tokenizer call goes through.
            assert (await call(client, url, chat("refused"))).status == 429
            for _ in range(3):
                reply = await call(client, url, TOKENIZE, path="/tokenize")
                assert reply.status == 200 and reply.json()["count"] == 3
            assert upstream.tokenized == 3
            assert len(gw.dispatcher.queue) == 1 and gw.pool.get("a").in_flight == 1
            metrics = await scrape(client, url)
            shed = {"reason": "queue_full", "class": "1"}
            assert metrics.value("servepilot_shed_total", shed) == 1
            upstream.release_all()
            assert (await blocker).status == 200 and (await waiting).status == 200
            assert [content_of(b) for b in upstream.received] == ["blocker", "waiting"]
            await eventually(until(lambda: gw.pool.total_in_flight() == 0))

    run(body())


def test_a_tokenizer_call_with_no_replica_up_is_a_503() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream]) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            upstream.health_status = 503
            await eventually(until(lambda: not gw.pool.ready()))
            reply = await call(client, url, TOKENIZE, path="/tokenize")
            assert reply.status == 503 and upstream.tokenized == 0
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_a_tokenizer_call_with_chat_messages_is_proxied() -> None:
    # vLLM's /tokenize counts `messages` with the chat template: bench sizes chat prompts by it.
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream]) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            messages = [{"role": "user", "content": "one two three"}]
            reply = await call(client, url, {"model": "m", "messages": messages}, path="/tokenize")
            assert reply.status == 200 and reply.json()["count"] == 5
            assert upstream.tokenized == 1
            # Neither form: the same 400 as before, naming the field vLLM expects.
            reply = await call(client, url, {"model": "m"}, path="/tokenize")
            assert "`prompt`" in reply.error(400)["message"]

    run(body())
