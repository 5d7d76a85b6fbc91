"""The simulated replica's KV events (`--kv-events-config`, engine/simserver/kvpublisher.py):
a real replica on its own loop, followed by the gateway's own feed and index over real ZMQ
sockets, sent real requests over loopback HTTP. What the index says a replica holds for a
prompt, keyed as the gateway keys it, is what the replica then reuses (its own
prefix-cache hits); evictions, a sleep and a late subscriber's replay keep it so."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from servepilot.core.errors import ConfigError
from servepilot.engine.metrics import EngineMetric, scrape
from servepilot.engine.simserver.kvconfig import parse_kv_events_config
from servepilot.engine.simserver.kvpublisher import encode_batch
from servepilot.engine.simserver.prefixmap import PrefixMap
from servepilot.gateway.kv_events import KvEventFeeds
from servepilot.gateway.kv_sources import KvEventsEndpoint, ask_sources, endpoint_from_sources
from servepilot.gateway.kv_wire import Batch, decode_batch
from servepilot.gateway.tokens import PromptBlocks, PromptTokenizer
from servepilot.routing.kv_index import (
    AllBlocksCleared,
    BlockHashing,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvIndex,
    external_hash,
    prompt_block_hashes,
)
from tests.unit.kv_events_support import eventually, vllm_kv_events
from tests.unit.sim_kv_support import BS, HASHING, chat, sim_args, tokenizer_folder
from tests.unit.sim_support import ThreadedSim


@pytest.fixture
def sim() -> Iterator[ThreadedSim]:
    with ThreadedSim(sim_args()) as server:
        yield server


def _ids_prompt(first: int, tokens: int) -> dict[str, Any]:
    return {"model": "smollm2", "prompt": list(range(first, first + tokens)), "max_tokens": 2}


class Follower:
    """The gateway's feed of one replica ("sim"), from where its /kv_event_sources says."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.feeds = KvEventFeeds(KvIndex(HASHING), quiet_probe_s=0.2)
        self.index = self.feeds.index
        self.keys = PromptBlocks(PromptTokenizer(tokenizer_folder()), HASHING)
        self.endpoint: KvEventsEndpoint | None = None

    async def follow(self) -> None:
        answer = await ask_sources(self.session, self.url)
        assert answer is not None
        found = endpoint_from_sources("sim", self.url, *answer)
        assert isinstance(found, KvEventsEndpoint), found
        self.endpoint = found
        self.feeds.subscribe("sim", found)
        await eventually(lambda: self.index.is_exact("sim"))

    def hashes(self, body: dict[str, Any]) -> tuple[bytes, ...]:
        keys = self.keys.keys(body)
        assert keys is not None
        return keys.block_hashes

    def cached(self, body: dict[str, Any]) -> int:
        """Prompt tokens the index says the replica reuses for `body`."""
        return self.index.cached_prefix_tokens("sim", self.hashes(body))

    async def send(self, body: dict[str, Any]) -> int:
        """Send `body`; the prompt tokens the replica reused for it (its /metrics)."""
        before = await self._hits()
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        async with self.session.post(self.url + path, json=body) as resp:
            assert resp.status == 200, await resp.text()
        return int(await self._hits() - before)

    async def _hits(self) -> float:
        async with self.session.get(self.url + "/metrics") as resp:
            return scrape(await resp.text()).total(EngineMetric.PREFIX_CACHE_HITS)

    async def replay(self, start_seq: int) -> list[Batch]:
        """The replica's replay socket's answer from `start_seq`, as a gateway asks it."""
        assert self.endpoint is not None
        context = zmq.asyncio.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.connect(self.endpoint.replay)
        batches: list[Batch] = []
        try:
            await dealer.send_multipart((b"", start_seq.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), 5.0)
                if frames[2] == (-1).to_bytes(8, "big", signed=True):
                    return batches
                batches.append(decode_batch(frames[2], frames[3], token_ids=True))
        finally:
            dealer.close(linger=0)
            context.term()


@contextlib.asynccontextmanager
async def _following(url: str) -> AsyncIterator[Follower]:
    async with aiohttp.ClientSession() as session:
        follower = Follower(session, url)
        try:
            await follower.follow()
            yield follower
        finally:
            await follower.feeds.close()


def _run(url: str, test: Any) -> None:
    async def body() -> None:
        async with _following(url) as follower:
            await asyncio.wait_for(test(follower), 60)

    asyncio.run(body())


def test_a_prompts_blocks_are_published_as_the_gateway_keys_them(sim: ThreadedSim) -> None:
    async def test(f: Follower) -> None:
        first = chat("What is the capital of France?")
        hashes = f.hashes(first)
        assert len(hashes) >= 6 and f.cached(first) == 0
        assert await f.send(first) == 0
        await eventually(lambda: f.cached(first) == len(hashes) * BS)
        assert await f.send(first) == len(hashes) * BS  # what the index predicted
        _check_stored_as_vllm(f, first, await f.replay(0))
        # Another question after the same system prompt: its blocks, not the first question's.
        second = chat("And the capital of Spain?")
        predicted = f.cached(second)
        assert 0 < predicted < len(f.hashes(second)) * BS
        assert await f.send(second) == predicted

    _run(sim.url, test)


def _check_stored_as_vllm(f: Follower, body: dict[str, Any], batches: list[Batch]) -> None:
    """The prompt's full blocks, stored in order as vLLM stores them: each event names its
    parent block and carries its blocks' token ids."""
    ids = f.keys.tokenizer.body_ids(body)
    assert ids is not None
    whole = [external_hash(d) for d in prompt_block_hashes([*ids, 0], HASHING)]
    stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == whole
    parents = [None] + [e.block_hashes[-1] for e in stored[:-1]]
    assert [e.parent_block_hash for e in stored] == parents
    assert [t for e in stored for t in e.token_ids] == ids[: len(whole) * BS]
    assert {(e.block_size, e.medium) for e in stored} == {(BS, "GPU")}


def test_a_prompt_prefilled_in_chunks_is_stored_chunk_by_chunk() -> None:
    chunked = ["--max-num-batched-tokens", str(2 * BS), "--max-num-seqs", "4"]
    with ThreadedSim(sim_args(*chunked)) as server:

        async def test(f: Follower) -> None:
            body = _ids_prompt(3, 6 * BS + 1)
            await f.send(body)
            await eventually(lambda: f.cached(body) == 6 * BS)
            batches = await f.replay(0)
            assert len(batches) >= 3  # one a step
            _check_stored_as_vllm(f, body, batches)

        _run(server.url, test)


def test_evicted_blocks_are_published_and_leave_the_index() -> None:
    """A KV cache of 24 blocks: distinct prompts of 6 blocks evict the oldest's."""
    small = ["--max-model-len", "256", "--kv-cache-memory-bytes", str(24 * BS * 46_080)]
    with ThreadedSim(sim_args(*small)) as server:

        async def test(f: Follower) -> None:
            prompts = [_ids_prompt(1000 * (i + 1), 6 * BS + 1) for i in range(6)]
            first = {external_hash(h) for h in f.hashes(prompts[0])}
            await f.send(prompts[0])
            await eventually(lambda: f.cached(prompts[0]) == 6 * BS)
            for prompt in prompts[1:]:
                await f.send(prompt)
            await eventually(lambda: f.cached(prompts[0]) < 6 * BS)
            removed = {
                h for b in await f.replay(0) for e in b.events
                if isinstance(e, BlockRemoved) for h in e.block_hashes
            }  # fmt: skip
            assert removed & first
            predicted = f.cached(prompts[0])
            assert await f.send(prompts[0]) == predicted

        _run(server.url, test)


def test_a_late_subscriber_catches_up_from_the_replay(sim: ThreadedSim) -> None:
    """A gateway that connects (or reconnects) after the replica served asks its replay
    socket from a sequence number; the answer is every kept batch from there."""

    async def test(f: Follower) -> None:
        bodies = [_ids_prompt(500 * (i + 1), 3 * BS + 1) for i in range(3)]
        for body in bodies:
            await f.send(body)
        await eventually(lambda: all(f.cached(b) == 3 * BS for b in bodies))
        everything = await f.replay(0)
        assert [b.seq for b in everything] == list(range(len(everything)))
        assert len(everything) >= 3
        assert await f.replay(1) == everything[1:]
        assert await f.replay(len(everything)) == []
        late = Follower(f.session, f.url)
        try:
            await late.follow()
            await eventually(lambda: all(late.cached(b) == 3 * BS for b in bodies))
            assert late.index.blocks_held("sim") == f.index.blocks_held("sim")
        finally:
            await late.feeds.close()

    _run(sim.url, test)


def test_a_sleep_clears_every_block() -> None:
    sleepy = ["--enable-sleep-mode", "--first-sleep-s", "0", "--sleep-s", "0", "--wake-s", "0"]
    with ThreadedSim(sim_args(*sleepy)) as server:

        async def test(f: Follower) -> None:
            await _cleared_by(f, "/sleep?level=1", then="/wake_up")

        _run(server.url, test)


def test_reset_prefix_cache_clears_every_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """As vLLM's dev-mode route: the cache is emptied, AllBlocksCleared is published, and the
    same prompt is not a hit; without VLLM_SERVER_DEV_MODE=1 there is no such route."""
    with ThreadedSim(sim_args()) as plain:

        async def refused(f: Follower) -> None:
            async with f.session.post(f.url + "/reset_prefix_cache") as resp:
                assert resp.status == 404

        _run(plain.url, refused)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    with ThreadedSim(sim_args()) as server:

        async def test(f: Follower) -> None:
            await _cleared_by(f, "/reset_prefix_cache")

        _run(server.url, test)


async def _cleared_by(f: Follower, path: str, then: str | None = None) -> None:
    """A cached prompt's blocks, then POST `path` (and `then`): every block leaves the index
    by an AllBlocksCleared, and the prompt is not a hit again until it is cached anew."""
    body = _ids_prompt(7, 4 * BS + 1)
    await f.send(body)
    await eventually(lambda: f.cached(body) == 4 * BS)
    for route in (path, then):
        if route is not None:
            async with f.session.post(f.url + route) as resp:
                assert resp.status == 200
    await eventually(lambda: f.index.blocks_held("sim") == 0)
    assert isinstance((await f.replay(0))[-1].events[-1], AllBlocksCleared)
    assert await f.send(body) == 0  # as the index said: nothing cached
    await eventually(lambda: f.cached(body) == 4 * BS)


def test_kv_event_sources_answers_as_vllm_does(sim: ThreadedSim) -> None:
    async def test(f: Follower) -> None:
        async with f.session.get(f.url + "/kv_event_sources") as resp:
            doc = await resp.json()
        assert list(doc) == ["0"]
        source = doc["0"]
        assert list(source) == ["enable_kv_cache_events", "publisher", "endpoint",
                                "replay_endpoint", "buffer_steps", "hwm", "max_queue_size",
                                "topic"]  # fmt: skip
        assert (source["publisher"], source["buffer_steps"], source["topic"]) == ("zmq", 10_000, "")
        port = int(source["endpoint"].removeprefix("tcp://*:"))
        assert port > 0 and f.endpoint == KvEventsEndpoint(
            f"tcp://127.0.0.1:{port}", source["replay_endpoint"].replace("*", "127.0.0.1")
        )

    _run(sim.url, test)
    with ThreadedSim(sim_args(events=False)) as quiet:

        async def silent() -> None:
            async with aiohttp.ClientSession() as session:
                answer = await ask_sources(session, quiet.url)
            assert answer == (200, b"{}")

        asyncio.run(silent())


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("[1]", "not a JSON object"),
        ("{nope", "not JSON"),
        ('{"enable_kv_cache_events": true, "port": 1}', "unknown field 'port'"),
        ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "publisher must be"),
    ],
)
def test_a_bad_config_is_refused_as_vllm_refuses_it(raw: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_kv_events_config(raw)


def test_vllms_defaults_decide_whether_it_publishes() -> None:
    assert not parse_kv_events_config(None).publishes
    on = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert on.publishes and (on.endpoint, on.replay_endpoint) == ("tcp://*:5557", None)
    assert on.sources()["0"]["publisher"] == "zmq"
    assert not parse_kv_events_config('{"publisher": "zmq"}').publishes
    assert parse_kv_events_config('{"enable_kv_cache_events": false}').sources() == {}


def test_a_batch_is_encoded_byte_for_byte_as_vllms() -> None:
    kv_events = vllm_kv_events()
    ours: list[KvEvent] = [
        BlockStored((11, 12), 10, tuple(range(2 * BS)), BS, "GPU"),
        BlockStored((13,), None, (), BS, "GPU"),
        BlockRemoved((11, 12), "GPU"),
        AllBlocksCleared(),
    ]
    theirs = kv_events.KVEventBatch(
        ts=1234.5,
        events=[
            kv_events.BlockStored(
                block_hashes=[11, 12], parent_block_hash=10, token_ids=list(range(2 * BS)),
                block_size=BS, lora_id=None, medium="GPU", lora_name=None,
                extra_keys=[None, None], group_idx=0,
            ),
            kv_events.BlockStored(
                block_hashes=[13], parent_block_hash=None, token_ids=[], block_size=BS,
                lora_id=None, medium="GPU", lora_name=None, extra_keys=[None], group_idx=0,
            ),
            kv_events.BlockRemoved(block_hashes=[11, 12], medium="GPU", group_idx=0),
            kv_events.AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )  # fmt: skip
    encoder = msgspec.msgpack.Encoder()
    assert encode_batch(1234.5, ours, encoder) == encoder.encode(theirs)


def test_a_group_the_prefix_map_forgets_is_published_as_removed() -> None:
    """Past its capacity the map drops its least recently used group, which no prompt can
    hit any more: its blocks are removed from the index, its later changes not published."""
    heard: list[KvEvent] = []
    prefixes = PrefixMap(BlockHashing(4), capacity=2, on_drop=heard.append)
    first = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    group, shared = prefixes.assign(first)
    assert group is not None and shared == 8
    keys = prefixes.block_keys(group, 0, 2)
    assert keys == [external_hash(d) for d in prompt_block_hashes(first, BlockHashing(4))]
    assert prefixes.block_tokens(group, 1, 2) == (5, 6, 7, 8)
    prefixes.assign([10, 11, 12, 13, 14])
    prefixes.assign([20, 21, 22, 23, 24])
    assert heard == [BlockRemoved(tuple(keys), "GPU")]
    assert prefixes.block_keys(group, 0, 2) is None
    prefixes.forget()
    assert heard[-1] == AllBlocksCleared()
