"""Protection end to end: circuit breakers, retries before the first byte, the hard limit.

Breaker timing runs on an injected fake clock; replicas are chosen round robin (in id order),
so which replica gets each request is known in advance.
"""

from __future__ import annotations

import json

import aiohttp

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    STREAM_CHAT,
    URGENT_KEY,
    FakeClock,
    Scrape,
    as_class,
    call,
    chat,
    eventually,
    gateway_in_front_of,
    in_background,
    read_event,
    run,
    scrape,
    until,
)


def transitions(metrics: Scrape, replica: str) -> dict[str, float]:
    moves = metrics.labelled("servepilot_breaker_transitions_total")
    return {
        dict(labels)["state"]: count
        for labels, count in moves.items()
        if dict(labels)["replica"] == replica
    }


# --- circuit breaker -------------------------------------------------------------------------


def test_breaker_opens_after_consecutive_errors_probes_once_then_closes() -> None:
    async def body() -> None:
        clock = FakeClock()
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        protection = {"breaker_failures": 3, "breaker_open_s": 10.0}
        async with (
            gateway_in_front_of([a, b], clock=clock, protection=protection) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            a.reply_status = 500
            served = []
            for _ in range(5):  # a, b, a, b, a: the third error in a row opens a's breaker
                reply = await call(client, url)
                served.append((reply.replica, reply.status))
            assert served == [("a", 502), ("b", 200), ("a", 502), ("b", 200), ("a", 502)]
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_breaker_state", {"replica": "a"}) == 2
            assert metrics.value("servepilot_breaker_state", {"replica": "b"}) == 0
            # A replica that answers (if with 500) stays in rotation: only the breaker acts.
            assert gw.pool.get("a").healthy

            a.reply_status = 200
            for _ in range(4):
                assert (await call(client, url)).replica == "b"
            assert len(a.received) == 3

            clock.advance(9.5)
            assert (await call(client, url)).replica == "b"  # still open
            clock.advance(0.5)
            a.hold_requests = True
            probe = in_background(client, url, chat("probe"))
            await eventually(until(lambda: a.holding == 1))
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_breaker_state", {"replica": "a"}) == 1
            # One probe at a time: the rest go to b while it is out.
            for _ in range(3):
                assert (await call(client, url)).replica == "b"
            a.release_all()
            assert (await probe).replica == "a" and (await probe).status == 200
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_breaker_state", {"replica": "a"}) == 0
            picks = [(await call(client, url)).replica for _ in range(4)]
            assert picks == ["a", "b", "a", "b"]

            async def logged() -> bool:
                moves = transitions(await scrape(client, url), "a")
                return moves == {"open": 1, "half_open": 1, "closed": 1}

            await eventually(logged)  # the dispatcher's ticker reports transitions

    run(body())


def test_a_failed_probe_opens_the_breaker_again() -> None:
    async def body() -> None:
        clock = FakeClock()
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        protection = {"breaker_failures": 1, "breaker_open_s": 5.0}
        async with (
            gateway_in_front_of([a, b], clock=clock, protection=protection) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            a.reply_status = 503
            assert (await call(client, url)).replica == "a"  # opens a's breaker
            assert [(await call(client, url)).replica for _ in range(3)] == ["b", "b", "b"]
            clock.advance(5.0)
            probe = await call(client, url)
            assert (probe.replica, probe.status) == ("a", 502)  # the probe fails...
            assert [(await call(client, url)).replica for _ in range(3)] == ["b", "b", "b"]
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_breaker_state", {"replica": "a"}) == 2
            clock.advance(5.0)  # ...and the open period starts again from it
            a.reply_status = 200
            picks = [(await call(client, url)).replica for _ in range(4)]
            assert picks == ["a", "b", "a", "b"]
            assert len(a.received) == 4
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_an_open_breaker_on_every_replica_is_a_503() -> None:
    async def body() -> None:
        clock = FakeClock()
        a = await FakeUpstream("a").start()
        protection = {"breaker_failures": 1, "breaker_open_s": 5.0}
        async with (
            gateway_in_front_of([a], clock=clock, protection=protection, retry_after_s=6) as (
                gw,
                url,
            ),
            aiohttp.ClientSession() as client,
        ):
            a.reply_status = 500
            assert (await call(client, url)).error(502)["code"] == "upstream_error"
            refused = await call(client, url)
            assert refused.error(503)["code"] == "no_ready_replica"
            assert refused.headers["Retry-After"] == "6"
            assert len(a.received) == 1
            clock.advance(5.0)
            a.reply_status = 200
            assert (await call(client, url)).status == 200
            assert gw.pool.total_in_flight() == 0

    run(body())


# --- retries ---------------------------------------------------------------------------------


def test_a_refused_connection_is_retried_on_another_replica_and_counted() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        async with (
            gateway_in_front_of([a, b], health_interval_s=30) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await a.stop()  # refuses connections from now on
            reply = await call(client, url, chat("retried"))
            assert (reply.status, reply.replica) == (200, "b")
            assert [m["messages"][0]["content"] for m in b.received] == ["retried"]
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_retries_total") == 1
            failed = {"replica": "a", "class": "1", "result": "failed"}
            assert metrics.value("servepilot_upstream_requests_total", failed) == 1
            ok = {"replica": "b", "class": "1", "result": "ok"}
            assert metrics.value("servepilot_upstream_requests_total", ok) == 1
            assert (
                metrics.value("servepilot_request_errors_total", {"reason": "upstream_connect"})
                == 1
            )
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_a_replica_dying_mid_stream_with_continuation_off_ends_it_with_an_error_event() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.die_mid_stream = True
        off = {"enabled": False}
        async with (
            gateway_in_front_of([a, b], health_interval_s=30, continuation=off) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.status == 200 and resp.headers["X-Servepilot-Replica"] == "a"
                assert b'"one"' in await read_event(resp)
                event = await read_event(resp)
                assert await resp.content.read() == b""
            assert json.loads(event.removeprefix(b"data: "))["error"]["code"] == (
                "upstream_interrupted"
            )
            assert b.received == []  # the answer had started: never sent elsewhere (off)
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_retries_total") == 0
            interrupted = {"replica": "a", "class": "1", "result": "interrupted"}
            assert metrics.value("servepilot_upstream_requests_total", interrupted) == 1
            assert (
                metrics.value("servepilot_request_errors_total", {"reason": "upstream_interrupted"})
                == 1
            )
            assert gw.pool.total_in_flight() == 0

    run(body())


# --- hard limit ------------------------------------------------------------------------------


def test_slow_first_bytes_shed_about_the_configured_share_of_batch_requests_only() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        # Every real first byte takes more than a microsecond: every stream crosses the limit.
        protection = {"hard_limit_ttfb_ms": 0.001, "hard_limit_shed_share": 0.5}
        async with (
            gateway_in_front_of([a], protection=protection, auth=URGENT_KEY) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            stream = {**STREAM_CHAT}
            for _ in range(7):  # the limit judges a replica on 8 streamed answers at least
                assert (await call(client, url, stream, headers=as_class(1))).status == 200
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_hard_limit_crossed") == 0
            for _ in range(10):
                assert (await call(client, url, headers=as_class(2))).status == 200
            assert (await call(client, url, stream, headers=as_class(1))).status == 200
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_hard_limit_crossed") == 1

            shed = 0
            for _ in range(200):
                reply = await call(client, url, headers=as_class(2))
                if reply.status == 429:
                    assert reply.error(429)["code"] == "hard_limit"
                    assert int(reply.headers["Retry-After"]) >= 1
                    shed += 1
                else:
                    assert reply.status == 200
            assert 70 <= shed <= 130  # 200 draws at 0.5 (seeded, so the same every run)
            for cls_ in (0, 1):
                for _ in range(50):
                    assert (await call(client, url, headers=as_class(cls_))).status == 200
            metrics = await scrape(client, url)
            sheds = metrics.labelled("servepilot_shed_total")
            assert {tuple(sorted(labels)): n for labels, n in sheds.items() if n} == {
                (("class", "2"), ("reason", "hard_limit")): shed
            }
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_the_hard_limit_stops_judging_a_replica_that_left_rotation() -> None:
    async def body() -> None:
        slow, fast = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        slow.reply_delay_s = 0.04  # its response heads come after 40 ms
        protection = {"hard_limit_ttfb_ms": 20.0, "hard_limit_shed_share": 1.0}
        async with (
            gateway_in_front_of([slow, fast], protection=protection) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            for _ in range(16):  # round robin: 8 streamed answers each
                assert (await call(client, url, STREAM_CHAT)).status == 200
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_hard_limit_crossed") == 1
            slow.health_status = 503
            await eventually(until(lambda: not gw.pool.get("a").healthy))

            async def not_crossed() -> bool:
                metrics = await scrape(client, url)
                return metrics.value("servepilot_hard_limit_crossed") == 0

            # Only the fast replica serves now: nothing is slow any more.
            await eventually(not_crossed, timeout_s=1.5)
            assert (await call(client, url, headers={"X-Priority": "2"})).status == 200

    run(body())
