"""Admission end to end, who is refused or leaves: class queue budgets, predicted waits, a full
queue, clients that leave, a fleet that goes down under its queue (who goes first:
test_gateway_admission_order.py; degradation under sustained saturation:
test_gateway_degradation.py).

Requests are kept in flight by upstreams that hold them until the test releases them, and
time-dependent rules (queue budgets) run on an injected fake clock, so no assertion depends on
how fast the machine is.
"""

from __future__ import annotations

import asyncio

import aiohttp

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    CLASSES,
    URGENT_KEY,
    FakeClock,
    as_class,
    assert_all_counters_zero,
    call,
    chat,
    content_of,
    eventually,
    gateway_in_front_of,
    in_background,
    priority,
    queued,
    run,
    scrape,
    until,
)


def test_a_request_waiting_past_its_class_budget_gets_429_and_the_others_keep_waiting() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        budgets = {"queue_budget_ms": (1000.0, 1000.0, 50.0)}
        async with (
            gateway_in_front_of([upstream], clock=clock, admission=budgets, retry_after_s=3) as (
                gw,
                url,
            ),
            aiohttp.ClientSession() as client,
        ):
            blocker = in_background(client, url, chat("blocker"))
            await eventually(until(lambda: upstream.holding == 1))
            batch = in_background(client, url, chat("batch"), headers=priority(2))
            await eventually(queued(gw, 1))
            default = in_background(client, url, chat("default"), headers=priority(1))
            await eventually(queued(gw, 2))
            clock.advance(0.051)  # past P2's 50 ms, far from P1's 1000 ms
            shed = await batch
            error = shed.error(429)
            assert error["code"] == "queue_budget" and error["type"] == "rate_limit_error"
            # No dispatch rate is measured yet (one dispatch): the configured Retry-After.
            assert shed.headers["Retry-After"] == "3"
            assert gw.dispatcher.queue.depth_by_class() == (0, 1, 0)
            assert not default.done()
            metrics = await scrape(client, url)
            labels = {"reason": "queue_budget", "class": "2"}
            assert metrics.value("servepilot_shed_total", labels) == 1
            assert (
                metrics.get("servepilot_shed_total", {"reason": "queue_budget", "class": "1"}) == 0
            )
            upstream.release_all()
            assert (await blocker).status == 200 and (await default).status == 200
            assert [content_of(b) for b in upstream.received] == ["blocker", "default"]
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_a_request_whose_predicted_wait_exceeds_its_budget_is_refused_on_arrival() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream = await FakeUpstream("a", capacity=1).start()
        budgets = {"queue_budget_ms": (10_000.0, 10_000.0, 500.0)}
        async with (
            gateway_in_front_of([upstream], clock=clock, admission=budgets) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            # Two dispatches 1 s apart: the gateway measures about one dispatch per second.
            assert (await call(client, url, chat("first"))).status == 200
            clock.advance(1.0)
            upstream.hold_requests = True
            blocker = in_background(client, url, chat("second"))
            await eventually(until(lambda: upstream.holding == 1))
            waiting = in_background(client, url, chat("p1"), headers=priority(1))
            await eventually(queued(gw, 1))
            # One request ahead at ~1.05/s is a ~950 ms wait: over P2's 500 ms budget.
            refused = await call(client, url, chat("p2"), headers=priority(2))
            assert refused.error(429)["code"] == "queue_budget"
            assert refused.headers["Retry-After"] == "1"
            assert len(gw.dispatcher.queue) == 1
            upstream.release_all()
            assert (await blocker).status == 200 and (await waiting).status == 200
            assert [content_of(b) for b in upstream.received] == ["first", "second", "p1"]
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_a_full_queue_refuses_new_requests_with_429() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of(
                [upstream], admission={"max_queued": 1}, auth=URGENT_KEY, retry_after_s=4
            ) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            blocker = in_background(client, url, chat("blocker"), headers=as_class(1))
            await eventually(until(lambda: upstream.holding == 1))
            waiting = in_background(client, url, chat("waiting"), headers=as_class(2))
            await eventually(queued(gw, 1))
            for cls_ in (0, 1, 2):  # the queue is full for every class
                refused = await call(client, url, chat("refused"), headers=as_class(cls_))
                assert refused.error(429)["code"] == "queue_full"
                assert refused.headers["Retry-After"] == "4"
            metrics = await scrape(client, url)
            for cls_name in CLASSES:
                labels = {"reason": "queue_full", "class": cls_name}
                assert metrics.value("servepilot_shed_total", labels) == 1
            upstream.release_all()
            assert (await blocker).status == 200 and (await waiting).status == 200
            assert [content_of(b) for b in upstream.received] == ["blocker", "waiting"]
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_a_client_that_leaves_while_queued_leaves_no_trace() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of([upstream], auth=URGENT_KEY) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            blocker = in_background(client, url, chat("blocker"), headers=as_class(1))
            await eventually(until(lambda: upstream.holding == 1))
            async with aiohttp.ClientSession() as leaving:
                # One leaves from the head of the queue, one from behind a request that stays.
                first_gone = in_background(leaving, url, chat("gone 0"), headers=as_class(0))
                await eventually(queued(gw, 1))
                stays = in_background(client, url, chat("stays"), headers=as_class(1))
                await eventually(queued(gw, 2))
                last_gone = in_background(leaving, url, chat("gone 2"), headers=as_class(2))
                await eventually(queued(gw, 3))
                first_gone.cancel()
                last_gone.cancel()
            await eventually(queued(gw, 1))
            assert gw.dispatcher.queue.depth_by_class() == (0, 1, 0)
            metrics = await scrape(client, url)
            assert [metrics.value("servepilot_queue_depth", {"class": c}) for c in CLASSES] == [
                0,
                1,
                0,
            ]
            upstream.release_all()
            assert (await blocker).status == 200 and (await stays).status == 200
            assert [content_of(b) for b in upstream.received] == ["blocker", "stays"]
            assert gw.metrics.error_counts()["client_disconnected"] == 2
            await assert_all_counters_zero(gw, client, url)
            # The slots the departed requests would have taken are free: new ones are served.
            for cls_ in (0, 2):
                assert (
                    await call(client, url, chat("after"), headers=as_class(cls_))
                ).status == 200
            assert upstream.max_in_flight == 1

    run(body())


def test_a_client_that_leaves_while_its_request_runs_frees_its_slot() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            async with aiohttp.ClientSession() as leaving:
                gone = in_background(leaving, url, chat("gone"))
                await eventually(until(lambda: upstream.holding == 1))
                waiting = in_background(client, url, chat("waiting"))
                await eventually(queued(gw, 1))
                gone.cancel()
            # The slot is released as the client leaves, not when the replica answers.
            await eventually(until(lambda: len(upstream.received) == 2))
            assert len(gw.dispatcher.queue) == 0 and gw.pool.get("a").in_flight == 1
            upstream.release_all()
            assert (await waiting).status == 200
            await assert_all_counters_zero(gw, client, url)
            metrics = await scrape(client, url)
            abandoned = {"replica": "a", "class": "1", "result": "abandoned"}
            assert metrics.value("servepilot_upstream_requests_total", abandoned) == 1
            ok = {"replica": "a", "class": "1", "result": "ok"}
            assert metrics.value("servepilot_upstream_requests_total", ok) == 1

    run(body())


def test_a_queued_request_is_answered_when_every_replica_goes_down() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of([upstream], clock=clock) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            blocker = in_background(client, url, chat("blocker"))
            await eventually(until(lambda: upstream.holding == 1))
            waiting = in_background(client, url, chat("waiting"))
            await eventually(queued(gw, 1))
            upstream.health_status = 503  # the replica goes down (its health checks fail)
            await eventually(until(lambda: not gw.pool.ready()))
            clock.advance(11.0)  # past P1's 10 s queue budget
            try:
                done, _ = await asyncio.wait([waiting], timeout=1.0)
                assert done, "the queued request got no answer"
                assert (await waiting).status in (429, 503)
            finally:
                upstream.health_status = 200
                upstream.release_all()
                await blocker
                await asyncio.wait([waiting], timeout=2.0)

    run(body())
