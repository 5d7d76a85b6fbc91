"""The gateway when its replicas fail: error statuses passed through or mapped, timeouts, a
stream cut mid-way, a client that leaves, refused connections retried, health and start-up.
Fake upstreams on 127.0.0.1; the scaffolding is in `gateway_support`.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    CHAT,
    HEADER,
    STREAM_CHAT,
    error_of,
    eventually,
    gateway_in_front_of,
    queued,
    read_event,
    run,
)


def test_upstream_4xx_is_passed_through_and_5xx_becomes_502() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            upstream.reply_status = 400
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.status == 400 and resp.headers[HEADER] == "a"
                # vLLM's own error body, in the gateway's shape: its message kept, its type
                # the code (vLLM's `code` is the HTTP status again), no `param`.
                assert await resp.json() == {"error": {
                    "message": "prompt too long", "type": "invalid_request_error",
                    "code": "bad_request",
                }}  # fmt: skip
            # One in another shape (not vLLM, or a framework's 404) is put in OpenAI's.
            upstream.reply_status, upstream.reply_body = 404, b'{"detail":"Not Found"}'
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                error = await error_of(resp, 404)
                assert error["message"] == (
                    "the model 'm' does not serve POST /v1/chat/completions: replica a answered "
                    '404 ({"detail":"Not Found"}); vLLM serves /v1/chat/completions for '
                    "generative models (vLLM's generate runner)"
                )
                assert (error["type"], error["code"]) == ("invalid_request_error", "not_found")
            upstream.reply_status, upstream.reply_body = 500, None
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                assert (await error_of(resp, 502))["code"] == "upstream_error"
                assert resp.headers[HEADER] == "a"
            assert gw.pool.total_in_flight() == 0
            # A replica that answers (even with an error) is not taken out of rotation.
            assert gw.pool.get("a").healthy

    run(body())


def test_upstream_timeout_is_504() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        upstream.reply_delay_s = 1.0
        async with (
            gateway_in_front_of([upstream], request_timeout_s=0.2) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                assert (await error_of(resp, 504))["code"] == "upstream_timeout"
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_upstream_dying_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        upstream.die_mid_stream = True
        no_wait = {"continuation": {"replica_wait_s": 0}}  # no other replica to wait for
        async with (
            gateway_in_front_of([upstream], **no_wait) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.status == 200
                assert b'"one"' in await read_event(resp)
                event = await read_event(resp)
                rest = await resp.content.read()  # ends cleanly: no exception
            assert event.startswith(b"data: ")
            error = json.loads(event[6:])["error"]
            assert error["code"] == "upstream_interrupted"
            assert "no other healthy replica" in error["message"]
            assert rest == b""
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_client_disconnect_aborts_the_upstream_request() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        upstream.endless_stream = True
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            resp = await client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT)
            assert b'"one"' in await read_event(resp)
            assert gw.pool.total_in_flight() == 1
            resp.close()  # drops the connection mid-stream
            await asyncio.wait_for(upstream.stream_aborted.wait(), timeout=3)

            async def idle() -> bool:
                return gw.pool.total_in_flight() == 0

            await eventually(idle)
            assert gw.metrics.error_counts()["client_disconnected"] == 1

    run(body())


def test_refused_replica_is_retried_taken_out_and_put_back() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        # A long health interval: the failed request, not a check, must take "a" out.
        async with (
            gateway_in_front_of([a, b], health_interval_s=30, unhealthy_after=1) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await a.stop()  # "a" now refuses connections
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200 and resp.headers[HEADER] == "b"
            assert not gw.pool.get("a").healthy
            assert gw.metrics.error_counts()["upstream_connect"] == 1
            for _ in range(3):
                async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    assert resp.headers[HEADER] == "b"
            await a.start()  # same port
            await gw.pool.check_all()
            assert gw.pool.get("a").healthy
            picks = set()
            for _ in range(2):
                async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    picks.add(resp.headers[HEADER])
            assert picks == {"a", "b"}
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_all_replicas_refusing_gives_502_then_503() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], health_interval_s=30, unhealthy_after=1) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await a.stop()
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                assert (await error_of(resp, 502))["code"] == "upstream_unreachable"
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                assert (await error_of(resp, 503))["code"] == "no_ready_replica"
                assert resp.headers["Retry-After"] == "2"
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_ready_follows_the_health_checker() -> None:
    async def body() -> None:
        upstream = FakeUpstream("a", starting=True)  # registered before it listens
        cold = {"cold_start_wait_s": 0.5}
        # The replica's startup window opens when the gateway adds it, after this: the answer
        # below comes 0.5 s after this at the earliest. (Timed from the request instead, the
        # wait was what was left of the window after a /ready that took 0.14 s on a busy
        # machine.) Without the wait it would come a gateway start after this, far sooner.
        before_add = asyncio.get_running_loop().time()
        async with (
            gateway_in_front_of([upstream], retry_after_s=7, admission=cold) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.get(f"{url}/ready") as resp:
                assert (await error_of(resp, 503))["code"] == "no_ready_replica"
            # A replica is starting: the request waits (cold-start buffer) until the replica's
            # startup window closes.
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                await error_of(resp, 503)
                assert resp.headers["Retry-After"] == "7"
            assert asyncio.get_running_loop().time() - before_add >= 0.5
            async with client.get(f"{url}/health") as resp:
                assert resp.status == 200

            async def ready_is(status: int) -> bool:
                async with client.get(f"{url}/ready") as resp:
                    return resp.status == status

            await upstream.start()
            await eventually(lambda: ready_is(200))
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
            await upstream.stop()
            await eventually(lambda: ready_is(503))
            # Every replica is down, none is starting: no waiting, an immediate 503.
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                await error_of(resp, 503)

    run(body())


def test_requests_wait_for_a_starting_replica_instead_of_failing() -> None:
    async def body() -> None:
        upstream = FakeUpstream("a", starting=True)  # registered before it listens
        async with (
            gateway_in_front_of([upstream]) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            sent = [
                asyncio.ensure_future(client.post(f"{url}/v1/chat/completions", json=CHAT))
                for _ in range(3)
            ]
            await eventually(queued(gw, 3))
            await upstream.start()
            for future in sent:
                async with await future as resp:
                    assert resp.status == 200 and resp.headers[HEADER] == "a"
            assert len(gw.dispatcher.queue) == 0 and gw.pool.total_in_flight() == 0

    run(body())
