"""Admission end to end, who goes first: replica budgets, the per-class queue and its order,
aging, the X-Priority header, waiters for different models (refusals:
test_gateway_admission_shed.py).

Requests are kept in flight by upstreams that hold them until the test releases them, and
time-dependent rules (aging) run on an injected fake clock, so no assertion depends on how
fast the machine is.
"""

from __future__ import annotations

import asyncio

import aiohttp

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    CLASSES,
    FakeClock,
    Reply,
    assert_all_counters_zero,
    call,
    chat,
    classes_served,
    content_of,
    eventually,
    gateway_in_front_of,
    in_background,
    priority,
    queued,
    reaches,
    run,
    scrape,
    until,
)


def test_replica_budget_caps_in_flight_and_the_rest_wait_in_order() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=2).start()
        upstream.hold_requests = True
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            replies: list[asyncio.Task[Reply]] = []
            for index in range(5):
                replies.append(in_background(client, url, chat(f"r{index}")))
                # One at a time, so that the order they reach the gateway is known.
                await eventually(
                    reaches(lambda: upstream.holding + len(gw.dispatcher.queue), index + 1)
                )
            assert upstream.holding == 2 and gw.pool.get("a").in_flight == 2
            assert gw.dispatcher.queue.depth_by_class() == (0, 3, 0)
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_queue_depth", {"class": "1"}) == 3
            assert metrics.value("servepilot_queue_depth", {"class": "0"}) == 0
            assert metrics.value("servepilot_in_flight_requests", {"replica": "a"}) == 2
            assert metrics.value("servepilot_replica_capacity", {"replica": "a"}) == 2
            assert metrics.value("servepilot_queued_total", {"class": "1"}) == 3

            for served in range(3, 6):
                upstream.release_next()
                # A freed slot goes to the next waiter, never beyond the budget.
                await eventually(reaches(lambda: len(upstream.received), served))
                assert upstream.holding == 2
                assert len(gw.dispatcher.queue) == 5 - served
            upstream.release_all()
            for reply in replies:
                assert (await reply).status == 200
            assert upstream.max_in_flight == 2
            assert [content_of(b) for b in upstream.received] == [f"r{i}" for i in range(5)]
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_queue_wait_seconds_count", {"class": "1"}) == 3
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_freed_slots_go_to_the_most_urgent_class_first() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            replies = [in_background(client, url, chat("blocker"))]
            await eventually(until(lambda: upstream.holding == 1))
            for depth, cls_ in enumerate((2, 1, 0), start=1):
                replies.append(in_background(client, url, chat(f"p{cls_}"), headers=priority(cls_)))
                await eventually(queued(gw, depth))
            assert gw.dispatcher.queue.depth_by_class() == (1, 1, 1)
            metrics = await scrape(client, url)
            assert [metrics.value("servepilot_queue_depth", {"class": c}) for c in CLASSES] == [
                1,
                1,
                1,
            ]
            for served in range(2, 5):
                upstream.release_next()
                await eventually(reaches(lambda: len(upstream.received), served))
            upstream.release_all()
            assert [(await reply).status for reply in replies] == [200] * len(replies)
            assert [content_of(b) for b in upstream.received] == ["blocker", "p0", "p1", "p2"]
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_a_batch_request_that_waited_long_enough_goes_before_a_fresh_default_one() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of([upstream], clock=clock, admission={"aging_s": 0.2}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            replies = [in_background(client, url, chat("blocker"))]
            await eventually(until(lambda: upstream.holding == 1))
            replies.append(in_background(client, url, chat("old p2"), headers=priority(2)))
            await eventually(queued(gw, 1))
            clock.advance(0.25)  # one aging step: the old P2 now ranks as a P1
            replies.append(in_background(client, url, chat("fresh p1"), headers=priority(1)))
            await eventually(queued(gw, 2))
            replies.append(in_background(client, url, chat("fresh p2"), headers=priority(2)))
            await eventually(queued(gw, 3))
            for served in range(2, 5):
                upstream.release_next()
                await eventually(reaches(lambda: len(upstream.received), served))
            upstream.release_all()
            assert [(await reply).status for reply in replies] == [200] * len(replies)
            # Among equals (effective class 1) the earlier arrival wins; the fresh P2 has not
            # aged and goes last.
            order = [content_of(b) for b in upstream.received]
            assert order == ["blocker", "old p2", "fresh p1", "fresh p2"]
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_invalid_x_priority_is_a_400_naming_the_header() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            for value in ("3", "-1", "high", "P0", "1.0", "01", ""):
                reply = await call(client, url, headers={"X-Priority": value})
                error = reply.error(400)
                assert error["code"] == "invalid_value", value
                assert "X-Priority" in error["message"], value
            assert upstream.received == []
            for value in ("1", "2", " 2 "):
                assert (await call(client, url, headers={"X-Priority": value})).status == 200
            metrics = await scrape(client, url)
            assert classes_served(metrics) == {"1": 1, "2": 2}
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_an_open_gateway_lets_x_priority_ask_for_p0() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            # Without API keys nobody is accountable for a class: the header decides.
            for cls_ in (0, 1, 2, 0):
                assert (await call(client, url, headers=priority(cls_))).status == 200
            assert (await call(client, url)).status == 200  # no header: P1
            assert classes_served(await scrape(client, url)) == {"0": 2, "1": 2, "2": 1}

    run(body())


def test_a_waiter_for_a_busy_model_does_not_block_a_free_replica_of_another_model() -> None:
    async def body() -> None:
        a = await FakeUpstream("a", models=("m",), capacity=1).start()
        b = await FakeUpstream("b", models=("y",), capacity=1).start()
        a.hold_requests = b.hold_requests = True
        async with (
            gateway_in_front_of([a, b]) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            tasks = [
                in_background(client, url, chat("m blocker")),
                in_background(client, url, {**chat("y blocker"), "model": "y"}),
            ]
            await eventually(until(lambda: a.holding == 1 and b.holding == 1))
            tasks.append(in_background(client, url, {**chat("y waiting"), "model": "y"}))
            await eventually(queued(gw, 1))
            tasks.append(in_background(client, url, chat("m waiting")))
            await eventually(queued(gw, 2))
            a.release_next()  # a is free; only the "m" waiter can use it
            try:
                await eventually(until(lambda: a.holding == 1), timeout_s=1.0)
                assert content_of(a.received[-1]) == "m waiting"
            finally:
                a.release_all()
                b.release_all()
                assert [(await task).status for task in tasks] == [200] * 4

    run(body())
