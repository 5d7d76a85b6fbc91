"""The gateway's KV event feed against vLLM's own ZMQ publisher (real sockets, in process):
replay on connect, catching up after a pause, a restarted replica, a silent one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from servepilot.engine.process import free_port
from servepilot.gateway.kv_events import KvEventFeeds, KvEventsEndpoint
from servepilot.routing.kv_index import BlockHashing, KvIndex, external_hash, prompt_block_hashes

kv_events = pytest.importorskip("vllm.distributed.kv_events")

HASHING = BlockHashing(block_size=4)


def _endpoint() -> KvEventsEndpoint:
    return KvEventsEndpoint(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")


def _publisher(endpoint: KvEventsEndpoint) -> Any:
    # vLLM binds only wildcard endpoints; the replica side is given one, the gateway connects.
    return kv_events.ZmqEventPublisher(
        0,
        endpoint=endpoint.publish.replace("127.0.0.1", "*"),
        replay_endpoint=endpoint.replay.replace("127.0.0.1", "*"),
    )


def _store(publisher: Any, tokens: list[int], ts: float) -> list[bytes]:
    digests = prompt_block_hashes([*tokens, 0], HASHING)
    event = kv_events.BlockStored(
        block_hashes=[external_hash(d) for d in digests],
        parent_block_hash=None,
        token_ids=tokens,
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    publisher.publish(kv_events.KVEventBatch(ts=ts, events=[event]))
    return digests


async def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


def test_events_before_and_after_subscribing_reach_the_index() -> None:
    async def body() -> None:
        endpoint = _endpoint()
        publisher = _publisher(endpoint)
        feeds = KvEventFeeds(KvIndex(HASHING))
        try:
            early = _store(publisher, [1, 2, 3, 4, 5, 6, 7, 8], ts=1.0)
            await asyncio.sleep(0.3)  # published to nobody: only the replay has it
            feeds.subscribe("r1", endpoint)
            index = feeds.index
            await _eventually(lambda: index.cached_prefix_tokens("r1", early) == 8)
            assert index.is_exact("r1")
            late = _store(publisher, [9, 9, 9, 9], ts=2.0)
            await _eventually(lambda: index.cached_prefix_tokens("r1", late) == 4)
        finally:
            await feeds.close()
            publisher.shutdown()

    _run(body)


def test_a_feed_that_reconnects_catches_up_from_the_replay() -> None:
    async def body() -> None:
        endpoint = _endpoint()
        publisher = _publisher(endpoint)
        index = KvIndex(HASHING)
        feeds = KvEventFeeds(index)
        try:
            feeds.subscribe("r1", endpoint)
            first = _store(publisher, [1, 1, 1, 1], ts=1.0)
            await _eventually(lambda: index.cached_prefix_tokens("r1", first) == 4)
            feed = feeds.feed("r1")
            assert feed is not None
            await feed.stop()  # the gateway's side drops: batches go by unseen
            missed = _store(publisher, [2, 2, 2, 2], ts=2.0)
            await asyncio.sleep(0.3)
            feed.start()
            await _eventually(lambda: index.cached_prefix_tokens("r1", missed) == 4)
            assert index.cached_prefix_tokens("r1", first) == 4
            assert feed.resyncs == 0
        finally:
            await feeds.close()
            publisher.shutdown()

    _run(body)


def test_a_restarted_replica_is_rebuilt_from_its_new_publisher() -> None:
    async def body() -> None:
        endpoint = _endpoint()
        publisher = _publisher(endpoint)
        index = KvIndex(HASHING)
        feeds = KvEventFeeds(index)
        try:
            feeds.subscribe("r1", endpoint)
            old = _store(publisher, [1, 1, 1, 1], ts=1.0)
            _store(publisher, [3, 3, 3, 3], ts=1.5)
            await _eventually(lambda: index.expected_seq("r1") == 2)
            feed = feeds.feed("r1")
            assert feed is not None
            await feed.stop()
            publisher.shutdown()
            publisher = _publisher(endpoint)  # the same endpoints, counting from 0 again
            new = _store(publisher, [2, 2, 2, 2], ts=3.0)
            await asyncio.sleep(0.3)
            feed.start()
            await _eventually(lambda: index.cached_prefix_tokens("r1", new) == 4)
            assert index.cached_prefix_tokens("r1", old) == 0
            assert feed.resyncs == 1
        finally:
            await feeds.close()
            publisher.shutdown()

    _run(body)


def test_a_replica_that_publishes_nothing_is_guessed_with_a_reason() -> None:
    async def body() -> None:
        index = KvIndex(HASHING)
        feeds = KvEventFeeds(index)
        try:
            feeds.subscribe("r2", _endpoint())  # nothing listens there
            await asyncio.sleep(0.1)
            assert not index.is_exact("r2")
            await _eventually(
                lambda: index.why_not_exact("r2") == "KV events are not flowing from r2"
            )
        finally:
            await feeds.close()

    _run(body)
