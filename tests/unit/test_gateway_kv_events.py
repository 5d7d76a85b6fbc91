"""The gateway's KV event feed against vLLM's own ZMQ publisher (real sockets, in process):
replay on connect, catching up after a pause, a restarted replica, a silent one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest

from servepilot.engine.model_source import embedded_model_dir
from servepilot.engine.ports import free_port
from servepilot.gateway.kv_events import KvEventFeeds
from servepilot.gateway.kv_sources import KvEventsEndpoint
from servepilot.gateway.kv_wire import decode_batch
from servepilot.gateway.tokens import PromptBlocks, PromptTokenizer
from servepilot.routing.kv_index import (
    AllBlocksCleared,
    BlockHashing,
    BlockRemoved,
    BlockStored,
    KvIndex,
    external_hash,
    prompt_block_hashes,
)
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import chat, gateway_in_front_of
from tests.unit.kv_events_support import (
    HASHING,
    eventually,
    new_endpoint,
    publisher_on,
    rebound,
    store,
    vllm_kv_events,
)


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


@contextlib.asynccontextmanager
async def _followed() -> AsyncIterator[tuple[KvEventsEndpoint, list[Any], KvEventFeeds]]:
    """A publisher as vLLM runs it (its list: a test may restart it) and the gateway's feeds."""
    endpoint = new_endpoint()
    publishers = [publisher_on(endpoint)]
    # Quiet spells probed often: a batch a busy machine's sockets lose is found sooner.
    feeds = KvEventFeeds(KvIndex(HASHING), quiet_probe_s=0.5)
    try:
        yield endpoint, publishers, feeds
    finally:
        await feeds.close()
        for publisher in publishers:
            publisher.shutdown()


def test_events_before_and_after_subscribing_reach_the_index() -> None:
    async def body() -> None:
        async with _followed() as (endpoint, (publisher,), feeds):
            early = store(publisher, [1, 2, 3, 4, 5, 6, 7, 8], ts=1.0)
            await asyncio.sleep(0.3)  # published to nobody: only the replay has it
            feeds.subscribe("r1", endpoint)
            index = feeds.index
            await eventually(lambda: index.cached_prefix_tokens("r1", early) == 8)
            assert index.is_exact("r1")
            late = store(publisher, [9, 9, 9, 9], ts=2.0)
            await eventually(lambda: index.cached_prefix_tokens("r1", late) == 4)

    _run(body)


def test_a_feed_that_reconnects_catches_up_from_the_replay() -> None:
    async def body() -> None:
        async with _followed() as (endpoint, (publisher,), feeds):
            index = feeds.index
            feeds.subscribe("r1", endpoint)
            first = store(publisher, [1, 1, 1, 1], ts=1.0)
            await eventually(lambda: index.cached_prefix_tokens("r1", first) == 4)
            feed = feeds.feed("r1")
            assert feed is not None
            await feed.stop()  # the gateway's side drops: batches go by unseen
            missed = store(publisher, [2, 2, 2, 2], ts=2.0)
            await asyncio.sleep(0.3)
            feed.start()
            await eventually(lambda: index.cached_prefix_tokens("r1", missed) == 4)
            assert index.cached_prefix_tokens("r1", first) == 4
            assert feed.resyncs == 0

    _run(body)


def test_a_restarted_replica_is_rebuilt_from_its_newpublisher_on() -> None:
    async def body() -> None:
        async with _followed() as (endpoint, publishers, feeds):
            index = feeds.index
            publisher = publishers[0]
            feeds.subscribe("r1", endpoint)
            old = store(publisher, [1, 1, 1, 1], ts=1.0)
            store(publisher, [3, 3, 3, 3], ts=1.5)
            await eventually(lambda: index.expected_seq("r1") == 2)
            feed = feeds.feed("r1")
            assert feed is not None
            await feed.stop()
            publisher.shutdown()
            publisher = await rebound(endpoint)  # the same endpoints, counting from 0 again
            publishers.append(publisher)
            new = store(publisher, [2, 2, 2, 2], ts=3.0)
            await asyncio.sleep(0.3)
            feed.start()
            await eventually(lambda: index.cached_prefix_tokens("r1", new) == 4)
            assert index.cached_prefix_tokens("r1", old) == 0
            assert feed.resyncs == 1

    _run(body)


def test_a_replica_that_publishes_nothing_is_guessed_with_a_reason() -> None:
    async def body() -> None:
        index = KvIndex(HASHING)
        feeds = KvEventFeeds(index)
        try:
            feeds.subscribe("r2", new_endpoint())  # nothing listens there
            await asyncio.sleep(0.1)
            assert not index.is_exact("r2")
            await eventually(
                lambda: index.why_not_exact("r2") == "KV events are not flowing from r2"
            )
        finally:
            await feeds.close()

    _run(body)


def test_the_gateway_routes_a_prompt_to_the_replica_whose_events_say_it_holds_it() -> None:
    """End to end in the gateway: its tokenizer, the exact index fed by a real publisher, the
    routing, and /admin/replicas telling exact from guessed."""
    folder = embedded_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")

    async def body() -> None:
        a, b = FakeUpstream("a"), FakeUpstream("b")
        await a.start()
        await b.start()
        endpoint = new_endpoint()
        publisher = publisher_on(endpoint)
        hashing = BlockHashing(block_size=16)
        settings = {"tokenizer": str(folder), "block_size": 16}
        async with (
            gateway_in_front_of([], policy="prefix_affinity", kv_index=settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await gw.membership.join("a", a.url, kv_events=_ports(endpoint))
            await gw.membership.join("b", b.url, kv_events=(free_port(), free_port()))
            request = chat("a question long enough to fill a few blocks " * 8)
            tokens = PromptTokenizer(folder).body_ids(request)
            assert tokens is not None
            digests = prompt_block_hashes(tokens, hashing)
            kv_events = vllm_kv_events()
            stored = kv_events.BlockStored(
                block_hashes=[external_hash(d) for d in digests],
                parent_block_hash=None,
                token_ids=tokens[: 16 * len(digests)],
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=[None] * len(digests),
            )
            publisher.publish(kv_events.KVEventBatch(ts=1.0, events=[stored]))
            index = gw.kv_feeds.index if gw.kv_feeds is not None else None
            assert index is not None
            await eventually(lambda: index.cached_prefix_tokens("a", digests) > 0)
            for _ in range(4):
                async with client.post(f"{url}/v1/chat/completions", json=request) as resp:
                    assert resp.status == 200
                    assert resp.headers["X-Servepilot-Replica"] == "a"
            async with client.get(f"{url}/admin/replicas") as resp:
                listed = {r["id"]: r for r in await resp.json()}
            assert listed["a"]["prefix_index"] == "exact"
            assert listed["b"]["prefix_index"] == "guessed"
            await eventually(lambda: index.why_not_exact("b") == "KV events are not flowing from b")
            async with client.get(f"{url}/metrics") as resp:
                page = await resp.text()
            assert 'servepilot_prefix_index_exact{replica="a"} 1.0' in page
            assert 'servepilot_prefix_index_exact{replica="b"} 0.0' in page
            # One batch published by a, none by b: what following each has cost in messages.
            assert 'servepilot_kv_event_batches_total{replica="a"} 1.0' in page
            assert 'servepilot_kv_event_batches_total{replica="b"} 0.0' in page
        publisher.shutdown()

    _run(body)


def _ports(endpoint: KvEventsEndpoint) -> tuple[int, int]:
    return int(endpoint.publish.rsplit(":", 1)[1]), int(endpoint.replay.rsplit(":", 1)[1])


def test_blocks_hashed_with_extra_keys_are_not_indexed() -> None:
    """A LoRA's or a multimodal prompt's blocks hash keys a plain prompt never has."""
    plain = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
             "token_ids": [1, 2, 3, 4], "block_size": 4, "extra_keys": [None]}  # fmt: skip
    salted = plain | {"block_hashes": [2], "extra_keys": [("salt",)]}
    lora = plain | {"block_hashes": [3], "lora_name": "adapter"}
    payload = msgspec.msgpack.encode([1.0, [plain, salted, lora], None])
    batch = decode_batch((7).to_bytes(8, "big"), payload)
    assert batch.seq == 7
    assert [e.block_hashes for e in batch.events if isinstance(e, BlockStored)] == [(1,)]


def test_a_batch_is_read_for_what_the_index_needs_and_unknown_events_are_skipped() -> None:
    stored = {"type": "BlockStored", "block_hashes": [11, b"\x01" * 32],
              "parent_block_hash": b"\x02" * 32, "token_ids": list(range(8)), "block_size": 4,
              "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None, None],
              "group_idx": 0, "kv_cache_spec_kind": "full_attention"}  # fmt: skip
    later = {"type": "BlockMoved", "block_hashes": [11], "to": "CPU"}  # a later vLLM's
    removed = {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}
    cleared = {"type": "AllBlocksCleared"}
    payload = msgspec.msgpack.encode([2.5, [stored, later, removed, cleared], 0])
    batch = decode_batch((3).to_bytes(8, "big"), payload)
    assert (batch.seq, batch.ts) == (3, 2.5)
    assert batch.events == (
        BlockStored((11, b"\x01" * 32), b"\x02" * 32, (), 4, "GPU"),  # type: ignore[arg-type]
        BlockRemoved((11,), "GPU"),
        AllBlocksCleared(),
    )
    with_ids = decode_batch((3).to_bytes(8, "big"), payload, token_ids=True)
    assert isinstance(with_ids.events[0], BlockStored)
    assert with_ids.events[0].token_ids == tuple(range(8))
    # A known event that does not parse is an error (the feed detaches), not a skipped one.
    broken = msgspec.msgpack.encode([2.5, [removed | {"block_hashes": "eleven"}], 0])
    with pytest.raises(ValueError, match="block_hashes"):
        decode_batch((4).to_bytes(8, "big"), broken)


def test_a_long_prompt_is_tokenised_off_the_event_loop() -> None:
    """A new 32k-token prompt takes the tokenizer about 125 ms here; on the event loop it
    would stall every stream the gateway relays meanwhile. A ticker beside it keeps ticking,
    and the keys are those tokenising on the caller's thread gives."""
    folder = embedded_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    blocks = PromptBlocks(PromptTokenizer(folder), BlockHashing(block_size=16))
    words = " ".join(f"word{i} and some more text" for i in range(6000))
    request = chat(words)

    async def body() -> tuple[int, Any]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        before = ticks
        keys = await blocks.keys_async(request)
        during = ticks - before
        task.cancel()
        return during, keys

    try:
        during, keys = asyncio.run(body())
    finally:
        blocks.close()
    fresh = PromptBlocks(PromptTokenizer(folder), BlockHashing(block_size=16))
    try:
        assert keys == fresh.keys(request)
    finally:
        fresh.close()
    assert keys is not None and keys.tokens > 30_000
    assert during >= 5  # on the loop it would be 0: the ticker cannot run meanwhile
