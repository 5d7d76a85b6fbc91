"""A replica given to the gateway without its KV event ports says where it publishes them
(vLLM's GET /kv_event_sources): its answer read, the feed started from it (vLLM's own
publisher, real sockets), and the replicas that publish none told apart in /admin/replicas."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from servepilot.engine.model_source import embedded_model_dir
from servepilot.gateway.kv_events import KvEventFeeds
from servepilot.gateway.kv_sources import KvEventsEndpoint, NoKvEvents, endpoint_from_sources
from servepilot.routing.kv_index import KvIndex
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import gateway_in_front_of
from tests.unit.kv_events_support import HASHING, eventually, new_endpoint, publisher_on, store


def _vllm_sources(publish: str, replay: str | None, **extra: Any) -> dict[str, Any]:
    """vLLM 0.32's answer for one rank (its KVEventsConfig as JSON)."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": publish,
              "replay_endpoint": replay, "buffer_steps": 10000, "hwm": 100000,
              "max_queue_size": 100000, "topic": ""}  # fmt: skip
    return {"0": config | extra}


def _read(doc: object, url: str = "http://10.0.0.5:8000", status: int = 200) -> Any:
    return endpoint_from_sources("r1", url, status, json.dumps(doc).encode())


def test_a_wildcard_endpoint_is_the_replicas_own_host() -> None:
    answer = _vllm_sources("tcp://*:5557", "tcp://*:5558")
    assert _read(answer) == KvEventsEndpoint("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")
    assert _read(answer, "http://[fd00::5]:8000") == KvEventsEndpoint(
        "tcp://[fd00::5]:5557", "tcp://[fd00::5]:5558"
    )
    bound = _vllm_sources("tcp://0.0.0.0:5557", "tcp://[::]:5558")
    assert _read(bound) == KvEventsEndpoint("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")
    named = _vllm_sources("tcp://kv.internal:5557", "ipc:///tmp/replay")
    assert _read(named) == KvEventsEndpoint("tcp://kv.internal:5557", "ipc:///tmp/replay")


@pytest.mark.parametrize(
    ("status", "doc", "why"),
    [
        (200, {}, "r1 publishes no KV events (started without --kv-events-config)"),
        (404, {"detail": "Not Found"}, "r1 has no /kv_event_sources"),
        (
            200,
            _vllm_sources("tcp://*:1", "tcp://*:2", enable_kv_cache_events=False),
            "enable_kv_cache_events off",
        ),
        (200, _vllm_sources("tcp://*:1", None), "without a replay socket"),
        (200, _vllm_sources("tcp://*:1", "tcp://*:2", publisher="null"), "not ZMQ"),
        (200, {**_vllm_sources("tcp://*:1", "tcp://*:2"), "1": {}}, "data-parallel (2 ranks"),
        (200, ["not", "an", "object"], "not a JSON object"),
    ],
)
def test_a_replica_whose_events_cannot_be_followed_says_why(
    status: int, doc: object, why: str
) -> None:
    found = _read(doc, status=status)
    assert isinstance(found, NoKvEvents)
    assert why in found.why


def test_a_replica_that_cannot_answer_yet_is_asked_again() -> None:
    assert endpoint_from_sources("r1", "http://h:1", 503, b"loading") is None


def test_the_feed_starts_once_the_replica_answers() -> None:
    """Asked while loading (no answer, then a 503), then its answer: the feed follows it,
    events published before it asked included (the replay)."""
    endpoint = new_endpoint()
    publisher = publisher_on(endpoint)
    answers: list[tuple[int, bytes] | None] = [None, (503, b"")]
    asked = 0

    async def ask() -> tuple[int, bytes] | None:
        nonlocal asked
        asked += 1
        if answers:
            return answers.pop(0)
        wildcards = (endpoint.publish, endpoint.replay)
        sources = _vllm_sources(*(e.replace("127.0.0.1", "*") for e in wildcards))
        return 200, json.dumps(sources).encode()

    async def body() -> None:
        feeds = KvEventFeeds(KvIndex(HASHING), quiet_probe_s=0.05)
        try:
            early = store(publisher, [1, 2, 3, 4, 5, 6, 7, 8], ts=1.0)
            feeds.learn("r1", "http://127.0.0.1:9", ask)
            assert not feeds.index.is_exact("r1")
            assert feeds.index.why_not_exact("r1") == (
                "r1 has not said where it publishes KV events"
            )
            await eventually(lambda: feeds.index.cached_prefix_tokens("r1", early) == 8)
            feed = feeds.feed("r1")
            assert feed is not None and feed.endpoint == endpoint
            assert asked == 3
        finally:
            await feeds.close()
            publisher.shutdown()

    asyncio.run(body())


def test_a_replica_that_leaves_while_loading_is_asked_no_more() -> None:
    asked = 0

    async def ask() -> tuple[int, bytes] | None:
        nonlocal asked
        asked += 1
        return None  # still loading

    async def body() -> None:
        feeds = KvEventFeeds(KvIndex(HASHING), quiet_probe_s=0.02)
        feeds.learn("r1", "http://127.0.0.1:9", ask)
        await eventually(lambda: asked >= 3)
        feeds.unsubscribe("r1")
        await asyncio.sleep(0.05)  # a cancelled ask settles
        settled = asked
        await asyncio.sleep(0.2)
        assert asked == settled
        assert feeds.index.why_not_exact("r1") is not None
        feeds.learn("r1", "http://127.0.0.1:9", ask)  # back again: asked again
        await eventually(lambda: asked > settled)
        await feeds.close()
        closed = asked
        await asyncio.sleep(0.1)
        assert asked == closed

    asyncio.run(body())


def test_the_gateway_follows_what_each_replica_says() -> None:
    """Replicas joined without ports (as `servepilot gateway --replica URL` and POST
    /admin/replicas add them): one publishes (exact), one does not (guessed: it says so), one
    has no such route (an older vLLM: guessed, and what to do)."""
    folder = embedded_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    endpoint = new_endpoint()
    publisher = publisher_on(endpoint)

    async def body() -> None:
        a, b, c = FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c")
        wildcards = (endpoint.publish, endpoint.replay)
        a.kv_event_sources = _vllm_sources(*(e.replace("127.0.0.1", "*") for e in wildcards))
        b.kv_event_sources = {}
        for upstream in (a, b, c):
            await upstream.start()
        settings = {"tokenizer": str(folder), "block_size": 4}
        async with (
            gateway_in_front_of([], policy="prefix_affinity", kv_index=settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await gw.membership.join("a", a.url)
            await gw.membership.join("b", b.url)
            async with client.post(f"{url}/admin/replicas", json={"id": "c", "url": c.url}) as r:
                assert r.status == 201
            index = gw.kv_feeds.index if gw.kv_feeds is not None else None
            assert index is not None
            held = store(publisher, [5, 6, 7, 8], ts=1.0)
            await eventually(lambda: index.cached_prefix_tokens("a", held) == 4)
            await eventually(lambda: index.why_not_exact("c") != index.why_not_exact("b"))
            async with client.get(f"{url}/admin/replicas") as resp:
                listed = {r["id"]: r for r in await resp.json()}
            assert listed["a"]["prefix_index"] == "exact"
            assert listed["a"]["kv_events"] == endpoint.publish
            assert listed["b"]["prefix_index_why"] == (
                "b publishes no KV events (started without --kv-events-config)"
            )
            assert listed["c"]["prefix_index_why"].startswith("c has no /kv_event_sources")
        for upstream in (a, b, c):
            await upstream.stop()
        publisher.shutdown()

    asyncio.run(body())
