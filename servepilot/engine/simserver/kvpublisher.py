"""The simulated replica's KV event publisher: vLLM's ZmqEventPublisher, on the server's loop.

On the wire as vLLM 0.32 (vllm/distributed/kv_events.py; gateway/kv_events.py reads it):
- PUB: one message per batch, `(topic, seq, payload)`: `seq` an 8-byte big-endian count from
  0, `payload` the msgpack of vLLM's KVEventBatch `[ts, [event, ...], data_parallel_rank]`,
  each event a map tagged by `type` with vLLM's fields in vLLM's order (`encode_batch`).
- ROUTER (the replay socket): a request `(identity, b"", start_seq)` is answered with every
  batch kept from `start_seq` on, `(identity, b"", topic, seq, payload)` each, then
  `(identity, b"", b"", -1, b"")`. The last `buffer_steps` batches are kept.

Where it differs, and why: vLLM hands each batch to a thread through a queue; here the engine
loop encodes it and hands it to ZMQ (a send on a PUB socket never waits: past the
high-water mark a slow subscriber misses messages, as with vLLM), and one task of the same
loop answers replay requests, so nothing is shared between threads. A tcp port 0 is bound
on any free port and reported with the host as given; vLLM reports its node's IP for
`tcp://*:0`, which is what the gateway makes of a wildcard anyway (gateway/kv_sources.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from servepilot.engine.simserver.kvconfig import KvEventsConfig
from servepilot.routing.kv_index import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

log = logging.getLogger(__name__)

_END_SEQ = (-1).to_bytes(8, "big", signed=True)
_DATA_PARALLEL_RANK = 0
_KV_CACHE_GROUP = 0
"""vLLM's one group of full-attention layers (its events name it)."""


def encode_batch(ts: float, events: Sequence[KvEvent], encoder: msgspec.msgpack.Encoder) -> bytes:
    """A batch's payload, byte for byte as vLLM's publisher encodes its KVEventBatch."""
    return encoder.encode([ts, [_event(e) for e in events], _DATA_PARALLEL_RANK])


def _event(event: KvEvent) -> dict[str, Any]:
    """vLLM's tagged struct as msgspec writes it: its fields in order, defaults left out."""
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": None,
            # One entry per block, none for a plain prompt (vLLM 0.32 sends the list).
            "extra_keys": [None] * len(event.block_hashes),
            "group_idx": _KV_CACHE_GROUP,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(event.block_hashes),
            "medium": event.medium,
            "group_idx": _KV_CACHE_GROUP,
        }
    assert isinstance(event, AllBlocksCleared)
    return {"type": "AllBlocksCleared"}


class KvEventPublisher:
    """Owns the PUB and ROUTER sockets, their ZMQ context, the replay buffer and the task
    that answers replays. Create it with `start` on the loop that will publish; `close`
    stops the task before it closes the sockets and ends the context."""

    def __init__(self, config: KvEventsConfig) -> None:
        """Binds (or connects) the sockets; zmq.ZMQError when an endpoint is taken or bad."""
        self._context = zmq.asyncio.Context()
        self._topic = config.topic.encode()
        self._encoder = msgspec.msgpack.Encoder()
        self._seq = itertools.count()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._pub: zmq.Socket[Any] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            self.config = self._open_sockets(config)
            """The config as bound: what GET /kv_event_sources answers."""
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self.batches = 0

    def _open_sockets(self, config: KvEventsConfig) -> KvEventsConfig:
        # A plain socket: a send on PUB never waits, so no future is made per batch.
        self._pub = zmq.Socket(self._context, zmq.PUB)
        self._pub.set_hwm(config.hwm)
        endpoint = _open(self._pub, config.endpoint)
        if config.replay_endpoint is None:
            return config.bound_to(endpoint, None)
        self._replay = self._context.socket(zmq.ROUTER)
        return config.bound_to(endpoint, _bind(self._replay, config.replay_endpoint))

    @classmethod
    def start(cls, config: KvEventsConfig) -> KvEventPublisher:
        """A publisher whose replay task runs on the running loop."""
        publisher = cls(config)
        if publisher._replay is not None:
            publisher._task = asyncio.get_running_loop().create_task(
                publisher._answer_replays(publisher._replay), name="kv-events-replay"
            )
        return publisher

    def publish(self, events: Sequence[KvEvent]) -> None:
        """One batch of events, numbered next, sent and kept for replay."""
        assert self._pub is not None, "published after close"
        seq = next(self._seq)
        payload = encode_batch(time.time(), events, self._encoder)
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.batches += 1

    async def _answer_replays(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid KV event replay request: %d frames", len(frames))
                continue
            try:
                await self._replay_to(router, frames[0], int.from_bytes(frames[2], "big"))
            except zmq.ZMQError as exc:  # one subscriber's failed answer stops no other's
                log.warning("KV event replay failed: %s", exc)

    async def _replay_to(self, router: zmq.asyncio.Socket, client: bytes, start: int) -> None:
        # Copied first: the engine may publish while the answer waits on a full pipe.
        for seq, payload in [kept for kept in self._buffer if kept[0] >= start]:
            await router.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        await router.send_multipart((client, b"", b"", _END_SEQ, b""))

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close_sockets()

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=0)
        self._pub = self._replay = None
        self._context.term()


def _open(socket: zmq.Socket[Any], endpoint: str) -> str:
    """vLLM's rule: a wildcard or local endpoint is bound, any other connected to."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        return _bind(socket, endpoint)
    socket.connect(endpoint)
    return endpoint


def _bind(socket: zmq.Socket[Any], endpoint: str) -> str:
    socket.bind(endpoint)
    if not (endpoint.startswith("tcp://") and endpoint.endswith(":0")):
        return endpoint
    bound = socket.getsockopt_string(zmq.LAST_ENDPOINT)
    return f"{endpoint.removesuffix(':0')}:{bound.rpartition(':')[2]}"
