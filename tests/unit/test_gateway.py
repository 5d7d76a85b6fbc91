"""The gateway in front of small fake OpenAI-shaped upstreams, all on 127.0.0.1.

The scaffolding (fake upstreams, the gateway fixture, helpers) is in `gateway_support`; the
admission, protection, auth, routing and upstream-failure behaviours have their own
test_gateway_*.py files.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servepilot.core.config import GatewayConfig
from servepilot.gateway import Gateway
from servepilot.routing.base import ReplicaView, RequestView, StatelessPolicy
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    CHAT,
    HEADER,
    STREAM_CHAT,
    VLLM_METRICS,
    error_of,
    gateway_in_front_of,
    read_event,
    run,
)

# --- streaming and spreading -----------------------------------------------------------------


def test_stream_is_relayed_chunk_by_chunk() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        upstream.gate = asyncio.Event()
        async with gateway_in_front_of([upstream]) as (gw, url), aiohttp.ClientSession() as client:
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                assert resp.status == 200
                assert resp.headers[HEADER] == "a"
                assert resp.content_type == "text/event-stream"
                # The upstream holds chunk 2 until chunk 1 has come out of the gateway.
                assert b'"one"' in await read_event(resp)
                assert gw.pool.total_in_flight() == 1
                upstream.gate.set()
                assert b'"two"' in await read_event(resp)
                assert await read_event(resp) == b"data: [DONE]\n\n"
                assert await resp.content.read() == b""
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_round_robin_spreads_requests_and_names_the_replica() -> None:
    async def body() -> None:
        upstreams = [await FakeUpstream("a").start(), await FakeUpstream("b").start()]
        async with gateway_in_front_of(upstreams) as (gw, url), aiohttp.ClientSession() as client:
            seen = []
            for _ in range(4):
                async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
                    doc = await resp.json()
                    seen.append(resp.headers[HEADER])
                    assert doc["choices"][0]["message"]["content"] == f"hello from {seen[-1]}"
            assert seen == ["a", "b", "a", "b"]
            assert [len(u.received) for u in upstreams] == [2, 2]
            # The body reaches the replica as the client sent it.
            assert upstreams[0].received[0] == CHAT
            completion = {"model": "m", "prompt": "once upon", "max_tokens": 3}
            async with client.post(f"{url}/v1/completions", json=completion) as resp:
                assert resp.status == 200 and resp.headers[HEADER] == "a"
            assert gw.pool.total_in_flight() == 0

    run(body())


def test_models_are_the_union_of_the_replicas_models() -> None:
    async def body() -> None:
        upstreams = [
            await FakeUpstream("a", models=("m", "x")).start(),
            await FakeUpstream("b", models=("m", "y")).start(),
        ]
        async with gateway_in_front_of(upstreams) as (_, url), aiohttp.ClientSession() as client:
            async with client.get(f"{url}/v1/models") as resp:
                doc = await resp.json()
            assert doc["object"] == "list"
            assert sorted(card["id"] for card in doc["data"]) == ["m", "x", "y"]
            # A model only "b" serves is only routed to "b".
            for _ in range(3):
                payload = {**CHAT, "model": "y"}
                async with client.post(f"{url}/v1/chat/completions", json=payload) as resp:
                    assert resp.headers[HEADER] == "b"

    run(body())


def test_any_model_is_accepted_while_no_replica_lists_its_models() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", models=()).start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            payload = {**CHAT, "model": "anything"}
            async with client.post(f"{url}/v1/chat/completions", json=payload) as resp:
                assert resp.status == 200
            assert upstream.received[0]["model"] == "anything"

    run(body())


# --- bad input ---------------------------------------------------------------------------------


BAD_REQUESTS: list[tuple[str, str, bytes, int, str]] = [
    ("POST", "/v1/chat/completions", b"{not json", 400, "invalid_json"),
    ("POST", "/v1/chat/completions", b"[1, 2]", 400, "invalid_json"),
    ("POST", "/v1/chat/completions", b"", 400, "invalid_json"),
    ("POST", "/v1/chat/completions", b"{}", 400, "missing_field"),
    ("POST", "/v1/chat/completions", b'{"model": "m"}', 400, "missing_field"),
    ("POST", "/v1/chat/completions", b'{"model": 3, "messages": [{}]}', 400, "invalid_value"),
    ("POST", "/v1/chat/completions", b'{"model": "m", "messages": "hi"}', 400, "invalid_value"),
    ("POST", "/v1/completions", b'{"model": "m", "messages": [{}]}', 400, "missing_field"),
    ("POST", "/v1/completions", b'{"model": "m", "prompt": 7}', 400, "invalid_value"),
    (
        "POST",
        "/v1/chat/completions",
        b'{"model": "m", "messages": [{}], "stream": "yes"}',
        400,
        "invalid_value",
    ),
    (
        "POST",
        "/v1/chat/completions",
        b'{"model": "nope", "messages": [{}]}',
        404,
        "model_not_found",
    ),
    ("GET", "/v1/nothing-here", b"", 404, "not_found"),
    ("GET", "/v1/chat/completions", b"", 405, "method_not_allowed"),
    ("DELETE", "/admin/replicas/ghost", b"", 404, "replica_not_found"),
    ("POST", "/admin/replicas", b'{"url": "ftp://x"}', 400, "invalid_value"),
    ("POST", "/admin/replicas", b'{"id": "a"}', 400, "missing_field"),
]


def test_bad_requests_get_openai_shaped_4xx() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            for method, path, payload, status, code in BAD_REQUESTS:
                async with client.request(method, url + path, data=payload) as resp:
                    error = await error_of(resp, status)
                    assert error["code"] == code, (path, payload, error)
            assert upstream.received == []

    run(body())


def test_oversized_bodies_get_413_with_and_without_content_length() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        limit = 2048
        huge = json.dumps({**CHAT, "pad": "x" * (2 * limit)}).encode()

        async def chunked() -> AsyncIterator[bytes]:
            for start in range(0, len(huge), 512):
                yield huge[start : start + 512]

        async with (
            gateway_in_front_of([upstream], max_body_bytes=limit) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            async with client.post(f"{url}/v1/chat/completions", data=huge) as resp:
                assert (await error_of(resp, 413))["code"] == "body_too_large"
            async with client.post(f"{url}/v1/chat/completions", data=chunked()) as resp:
                assert (await error_of(resp, 413))["code"] == "body_too_large"
            assert upstream.received == []

    run(body())


def test_unexpected_failure_is_a_json_500_not_a_crash() -> None:
    class BrokenPolicy(StatelessPolicy):
        name = "broken"

        def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
            raise RuntimeError("bug")

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        gateway = Gateway(GatewayConfig(port=0), BrokenPolicy())
        await gateway.pool.add("a", upstream.url)
        port = await gateway.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as client:
                async with client.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT
                ) as resp:
                    assert (await error_of(resp, 500))["code"] == "internal_error"
                async with client.get(f"http://127.0.0.1:{port}/health") as resp:
                    assert resp.status == 200
        finally:
            await gateway.stop(drain_timeout_s=0.5)
            await upstream.stop()

    run(body())


# --- admin, drain, metrics -----------------------------------------------------------------


def test_admin_adds_lists_and_drains_replicas() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("up").start()
        upstream.gate = asyncio.Event()
        async with gateway_in_front_of([]) as (gw, url), aiohttp.ClientSession() as client:
            admin = f"{url}/admin/replicas"
            async with client.post(admin, json={"id": "x", "url": upstream.url + "/"}) as resp:
                assert resp.status == 201
                added = await resp.json()
            assert added["id"] == "x" and added["url"] == upstream.url and added["healthy"]
            async with client.post(admin, json={"id": "x", "url": upstream.url}) as resp:
                assert (await error_of(resp, 409))["code"] == "conflict"
            async with client.post(admin, json={"url": upstream.url}) as resp:
                generated = (await resp.json())["id"]
            async with client.get(admin) as resp:
                listed = await resp.json()
            assert sorted(r["id"] for r in listed) == sorted(["x", generated])
            assert set(listed[0]) >= {"id", "url", "healthy", "in_flight", "running", "waiting"}
            async with client.delete(f"{admin}/{generated}") as resp:
                assert (await resp.json())["drained"] is True

            stream = await client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT)
            assert stream.headers[HEADER] == "x"
            assert b'"one"' in await read_event(stream)
            removal = asyncio.create_task(client.delete(f"{admin}/x"))
            await asyncio.sleep(0.1)
            assert not removal.done()  # waits for the in-flight stream
            async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                await error_of(resp, 503)  # but no longer routes to "x"
            upstream.gate.set()
            assert (await stream.read()).endswith(b"data: [DONE]\n\n")
            async with await removal as resp:
                assert resp.status == 200 and (await resp.json())["drained"] is True
            assert gw.pool.replicas() == []
        await upstream.stop()

    run(body())


def test_stop_lets_in_flight_streams_finish() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        upstream.gate = asyncio.Event()
        gateway = Gateway(GatewayConfig(port=0, health_interval_s=0.05))
        await gateway.pool.add("a", upstream.url)
        port = await gateway.start("127.0.0.1", 0)
        async with aiohttp.ClientSession() as client:
            stream = await client.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json=STREAM_CHAT
            )
            assert b'"one"' in await read_event(stream)
            stopping = asyncio.create_task(gateway.stop(drain_timeout_s=5))
            await asyncio.sleep(0.1)
            assert not stopping.done()
            with pytest.raises(aiohttp.ClientConnectionError):
                await client.get(f"http://127.0.0.1:{port}/health")
            upstream.gate.set()
            assert (await stream.read()).endswith(b"data: [DONE]\n\n")
            await stopping
        assert gateway.pool.total_in_flight() == 0
        await upstream.stop()

    run(body())


def test_metrics_and_scraped_load() -> None:
    async def body() -> None:
        upstream = FakeUpstream("a")
        upstream.metrics_text = VLLM_METRICS
        await upstream.start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            for _ in range(2):
                async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200
            async with client.get(f"{url}/v1/nothing") as resp:
                assert resp.status == 404
            async with client.get(f"{url}/admin/replicas") as resp:
                (replica,) = await resp.json()
            assert (replica["running"], replica["waiting"]) == (5, 4)
            assert replica["kv_cache_usage"] == 0.5
            async with client.get(f"{url}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in families.values()
            for s in family.samples
        }
        route = ("route", "/v1/chat/completions")
        assert samples[("servepilot_requests_total", (("code", "200"), route))] == 2
        assert (
            samples[("servepilot_requests_total", (("code", "404"), ("route", "unmatched")))] == 1
        )
        assert samples[("servepilot_replica_healthy", (("replica", "a"),))] == 1
        assert samples[("servepilot_in_flight_requests", (("replica", "a"),))] == 0
        assert samples[("servepilot_upstream_ttfb_seconds_count", (("replica", "a"),))] == 2
        assert "servepilot_request_errors" in families

    run(body())
