"""vLLM's own ZMQ KV event publisher, as the gateway's feed tests run it (real sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from servepilot.engine.ports import free_port
from servepilot.gateway.kv_sources import KvEventsEndpoint
from servepilot.routing.kv_index import BlockHashing, external_hash, prompt_block_hashes

HASHING = BlockHashing(block_size=4)


def new_endpoint() -> KvEventsEndpoint:
    return KvEventsEndpoint(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")


def vllm_kv_events() -> Any:
    """vLLM's module, imported when a test first runs: imported at collection, it put vLLM and
    torch into every pytest worker, seconds each, for two modules one worker runs."""
    return pytest.importorskip("vllm.distributed.kv_events")


def publisher_on(endpoint: KvEventsEndpoint) -> Any:
    # vLLM binds only wildcard endpoints; the replica side is given one, the gateway connects.
    return vllm_kv_events().ZmqEventPublisher(
        0,
        endpoint=endpoint.publish.replace("127.0.0.1", "*"),
        replay_endpoint=endpoint.replay.replace("127.0.0.1", "*"),
    )


async def rebound(endpoint: KvEventsEndpoint) -> Any:
    """A new publisher on the endpoints of one just shut down, once they are free (a busy
    machine may take a moment to let them go)."""
    for _ in range(50):
        try:
            return publisher_on(endpoint)
        except zmq.ZMQError:
            await asyncio.sleep(0.1)
    return publisher_on(endpoint)


def store(publisher: Any, tokens: list[int], ts: float) -> list[bytes]:
    digests = prompt_block_hashes([*tokens, 0], HASHING)
    kv_events = vllm_kv_events()
    event = kv_events.BlockStored(
        block_hashes=[external_hash(d) for d in digests],
        parent_block_hash=None,
        token_ids=tokens,
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None] * len(digests),  # as vLLM 0.32 sends them: one per block
        group_idx=0,
    )
    publisher.publish(kv_events.KVEventBatch(ts=ts, events=[event]))
    return digests


async def eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
