"""API keys end to end: 401s, each key's class, rate limits, the admin key, and secrecy."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import openai
import pytest
from pydantic import ValidationError

from servepilot.core.config import GatewayConfig
from servepilot.core.errors import ConfigError
from servepilot.gateway import Gateway
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    FakeClock,
    call,
    chat,
    classes_served,
    content_of,
    eventually,
    gateway_in_front_of,
    in_background,
    reaches,
    run,
    scrape,
    until,
)

ALICE = "sk-alice-5b7c1e9d"  # class P1, in the config file
BULK = "sk-bulk-0a4f6e2c"  # class P2, from the environment
LIMITED = "sk-limited-93d1b8a0"  # class P1, 0.4 requests/s, burst 3
ADMIN = "sk-admin-c2e8f7a1"
BULK_ENV = "SERVEPILOT_TEST_BULK_KEY"
ADMIN_ENV = "SERVEPILOT_TEST_ADMIN_KEY"


def keys(**extra: Any) -> dict[str, Any]:
    return {
        "keys": [
            {"name": "alice", "key": ALICE, "priority": 1},
            {"name": "bulk", "key_env": BULK_ENV, "priority": 2},
            {"name": "limited", "key": LIMITED, "rate_per_s": 0.4, "burst": 3},
        ],
        **extra,
    }


def bearer(secret: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **extra}


@pytest.fixture(autouse=True)
def _bulk_key_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BULK_ENV, BULK)
    monkeypatch.delenv(ADMIN_ENV, raising=False)


# --- inference routes ------------------------------------------------------------------------


def test_requests_need_a_valid_key() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], auth=keys()) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            refused: list[dict[str, str]] = [
                {},
                bearer("sk-wrong"),
                bearer(ALICE + "x"),
                bearer(ALICE[:-1]),
                {"Authorization": ALICE},  # no scheme
                {"Authorization": f"Basic {ALICE}"},
                {"Authorization": "Bearer "},
            ]
            for headers in refused:
                reply = await call(client, url, headers=headers)
                error = reply.error(401)
                assert (error["code"], error["type"]) == ("invalid_api_key", "authentication_error")
                assert reply.headers["WWW-Authenticate"] == "Bearer", headers
            assert upstream.received == []
            for headers in (
                bearer(ALICE),
                bearer(BULK),  # read from the environment
                {"Authorization": f"bearer {ALICE}"},  # the scheme is case-insensitive
            ):
                assert (await call(client, url, headers=headers)).status == 200, headers
            # The gateway's key is not the replica's business: it is not forwarded.
            assert all("authorization" not in seen for seen in upstream.received_headers)
            # The informational routes stay open.
            for path in ("/health", "/ready", "/metrics", "/v1/models"):
                assert (await call(client, url, path=path, method="GET")).status == 200, path
            metrics = await scrape(client, url)
            route = {"route": "/v1/chat/completions"}
            assert metrics.value("servepilot_requests_total", {**route, "code": "401"}) == 7
            assert metrics.value("servepilot_requests_total", {**route, "code": "200"}) == 3
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_a_key_sets_the_class_which_x_priority_may_lower_but_never_raise() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], auth=keys()) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            sent = [
                bearer(ALICE),  # 1
                bearer(ALICE, **{"X-Priority": "0"}),  # 1: cannot raise itself
                bearer(ALICE, **{"X-Priority": "2"}),  # 2: may lower itself
                bearer(BULK),  # 2
                bearer(BULK, **{"X-Priority": "0"}),  # 2
                bearer(BULK, **{"X-Priority": "1"}),  # 2
            ]
            for headers in sent:
                assert (await call(client, url, headers=headers)).status == 200
            assert classes_served(await scrape(client, url)) == {"1": 2, "2": 4}

    run(body())


def test_a_key_class_decides_its_place_in_the_queue() -> None:
    async def body() -> None:
        urgent = {"name": "web", "key": "sk-web-1", "priority": 0}
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of([upstream], auth={"keys": [*keys()["keys"], urgent]}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            tasks = [in_background(client, url, chat("blocker"), headers=bearer(ALICE))]
            await eventually(until(lambda: upstream.holding == 1))
            for depth, (name, secret) in enumerate(
                [("bulk", BULK), ("alice", ALICE), ("web", "sk-web-1")], start=1
            ):
                tasks.append(in_background(client, url, chat(name), headers=bearer(secret)))
                await eventually(reaches(lambda: len(gw.dispatcher.queue), depth))
            assert gw.dispatcher.queue.depth_by_class() == (1, 1, 1)
            upstream.release_all()
            assert [(await task).status for task in tasks] == [200] * 4
            order = [content_of(b) for b in upstream.received]
            assert order == ["blocker", "web", "alice", "bulk"]

    run(body())


def test_a_key_rate_limit_answers_429_with_retry_after_once_the_burst_is_spent() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], clock=clock, auth=keys()) as (_, url),
            aiohttp.ClientSession() as client,
        ):

            async def statuses(count: int) -> list[int]:
                return [
                    (await call(client, url, headers=bearer(LIMITED))).status for _ in range(count)
                ]

            assert await statuses(3) == [200, 200, 200]  # the burst
            limited = await call(client, url, headers=bearer(LIMITED))
            error = limited.error(429)
            assert (error["code"], error["type"]) == ("rate_limited", "rate_limit_error")
            assert "limited" in error["message"]  # the key's name, not the key
            assert limited.headers["Retry-After"] == "3"  # one token at 0.4/s: 2.5 s
            # Other keys have their own buckets.
            assert (await call(client, url, headers=bearer(ALICE))).status == 200
            clock.advance(2.0)
            refused = await call(client, url, headers=bearer(LIMITED))
            assert refused.error(429)["code"] == "rate_limited"
            assert refused.headers["Retry-After"] == "1"  # 0.8 token: 0.5 s to go
            clock.advance(0.5)
            assert await statuses(2) == [200, 429]
            clock.advance(3600.0)  # a long pause refills the bucket to its burst, no more
            assert await statuses(4) == [200, 200, 200, 429]
            assert len(upstream.received) == 3 + 1 + 1 + 3
            metrics = await scrape(client, url)
            route = {"route": "/v1/chat/completions"}
            assert metrics.value("servepilot_requests_total", {**route, "code": "429"}) == 4

    run(body())


def test_the_official_client_gets_typed_errors_it_understands() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream], clock=clock, auth=keys()) as (_, url):
            messages: list[Any] = [{"role": "user", "content": "hi"}]
            async with openai.AsyncOpenAI(
                base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0
            ) as wrong:
                with pytest.raises(openai.AuthenticationError) as refused:
                    await wrong.chat.completions.create(model="m", messages=messages)
            assert (refused.value.status_code, refused.value.code) == (401, "invalid_api_key")
            async with openai.AsyncOpenAI(
                base_url=f"{url}/v1", api_key=LIMITED, max_retries=0
            ) as limited:
                for _ in range(3):
                    answer = await limited.chat.completions.create(model="m", messages=messages)
                    assert answer.choices[0].message.content == "hello from a"
                with pytest.raises(openai.RateLimitError) as shed:
                    await limited.chat.completions.create(model="m", messages=messages)
            assert (shed.value.status_code, shed.value.code) == (429, "rate_limited")
            assert shed.value.response.headers["retry-after"] == "3"

    run(body())


def test_keys_appear_nowhere_in_metrics_logs_or_upstream_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], auth=keys()) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            for secret in (ALICE, BULK, "sk-typo-77", *[LIMITED] * 5):
                await call(client, url, headers=bearer(secret))
            await call(client, url, raw=b"{not json", headers=bearer(ALICE))
            metrics = await scrape(client, url)
            listing = await call(client, url, path="/admin/replicas", method="GET")
        seen = metrics.text + caplog.text + repr(upstream.received_headers) + listing.body.decode()
        for secret in (ALICE, BULK, LIMITED, "sk-typo-77"):
            assert secret not in seen
        assert len(upstream.received) == 5

    run(body())


def test_a_key_env_naming_an_unset_variable_is_a_config_error_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(BULK_ENV)
    with pytest.raises(ConfigError) as unset:
        Gateway(GatewayConfig(auth=keys()))
    assert "bulk" in str(unset.value) and BULK_ENV in str(unset.value)
    monkeypatch.setenv(BULK_ENV, "")
    with pytest.raises(ConfigError) as empty:
        Gateway(GatewayConfig(auth=keys()))
    assert "bulk" in str(empty.value)
    with pytest.raises(ConfigError) as admin:
        Gateway(GatewayConfig(auth={"admin_key_env": ADMIN_ENV}))
    assert ADMIN_ENV in str(admin.value)


def test_an_empty_key_never_lets_an_empty_token_in() -> None:
    empty_key = {"keys": [{"name": "oops", "key": ""}]}
    try:
        GatewayConfig(auth=empty_key)
    except ValidationError:
        return  # refusing the configuration is one fix

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], auth=empty_key) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            reply = await call(client, url, headers={"Authorization": "Bearer "})
            assert reply.status == 401, "an empty bearer token was accepted"

    try:
        run(body())
    except ConfigError:
        return  # so is refusing it when the gateway is built


# --- admin routes ----------------------------------------------------------------------------


async def admin_statuses(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str], upstream: FakeUpstream
) -> tuple[int, int, int]:
    """GET, POST and DELETE /admin/replicas with `headers`."""
    listing = await call(client, url, path="/admin/replicas", method="GET", headers=headers)
    add = {"id": "extra", "url": upstream.url}
    added = await call(client, url, add, path="/admin/replicas", headers=headers)
    removed = await call(
        client, url, path="/admin/replicas/extra?timeout_s=0", method="DELETE", headers=headers
    )
    return listing.status, added.status, removed.status


def test_admin_routes_are_open_without_keys() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            assert await admin_statuses(client, url, {}, upstream) == (200, 201, 200)

    run(body())


def test_admin_routes_are_closed_with_keys_and_no_admin_key() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], auth=keys()) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            for headers in ({}, bearer(ALICE), bearer(ADMIN)):
                assert await admin_statuses(client, url, headers, upstream) == (403, 403, 403)
            reply = await call(client, url, path="/admin/replicas", method="GET")
            assert reply.error(403)["code"] == "admin_closed"
            assert [r.replica_id for r in gw.pool.replicas()] == ["a"]

    run(body())


def test_admin_routes_need_the_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN)

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], auth=keys(admin_key_env=ADMIN_ENV)) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            for headers in ({}, bearer(ALICE), bearer("sk-wrong")):
                assert await admin_statuses(client, url, headers, upstream) == (401, 401, 401)
            reply = await call(client, url, path="/admin/replicas", method="GET")
            assert reply.error(401)["code"] == "invalid_api_key"
            assert reply.headers["WWW-Authenticate"] == "Bearer"
            assert await admin_statuses(client, url, bearer(ADMIN), upstream) == (200, 201, 200)
            # The warm pool's routes too: refused without the key, judged with it (`a` is awake).
            wake = "/admin/replicas/a/wake"
            assert (await call(client, url, path=wake, headers=bearer(ALICE))).status == 401
            assert (await call(client, url, path=wake, headers=bearer(ADMIN))).status == 409
            # The admin key is for the admin routes only.
            assert (await call(client, url, headers=bearer(ADMIN))).status == 401
            assert [r.replica_id for r in gw.pool.replicas()] == ["a"]
            metrics = await scrape(client, url)
            assert ADMIN not in metrics.text

    run(body())


def test_an_admin_key_alone_guards_the_admin_routes_of_an_open_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN)

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([upstream], auth={"admin_key_env": ADMIN_ENV}) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            assert await admin_statuses(client, url, {}, upstream) == (401, 401, 401)
            assert await admin_statuses(client, url, bearer(ADMIN), upstream) == (200, 201, 200)
            assert (await call(client, url)).status == 200  # inference needs no key

    run(body())
