"""The gateway's subscriptions to its replicas' KV events (vLLM's `--kv-events-config`, ZMQ).

vLLM publishes on a PUB socket, one message per batch of events (`gateway.kv_wire` reads
them). Its ROUTER replay socket answers `(b"", start_seq)` with every buffered batch from
`start_seq`, then an end marker whose seq is -1 (vllm/distributed/kv_events.py,
ZmqEventPublisher).

One `KvEventFeed` per replica feeds the shared `KvIndex`. It asks the replay socket for the
last batch it applied, on connecting and whenever the stream has been quiet a while: an answer
proves the publisher is alive (else the replica is guessed: "KV events are not flowing from
r2"); an answer that lacks that batch, or holds another batch under its number, means the
replica restarted or the buffer moved past us, so the replica's blocks are rebuilt from what
the replay holds. A gap in the live stream is filled the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator

import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from servepilot.gateway.kv_sources import (
    KvEventsEndpoint,
    NoKvEvents,
    endpoint_from_sources,
)
from servepilot.gateway.kv_wire import Batch, decode_batch
from servepilot.gateway.zmq_reader import LoopReader
from servepilot.routing.kv_index import (
    Applied,
    KvIndex,
)

log = logging.getLogger(__name__)

_END_SEQ = -1
_RECV_HWM = 100_000

Ask = Callable[[], Awaitable[tuple[int, bytes] | None]]
"""GET the replica's /kv_event_sources: its status and body, None when it did not answer."""


class KvEventFeed:
    """One replica's events into the index: a SUB socket, a replay DEALER, a task."""

    def __init__(
        self,
        replica_id: str,
        endpoint: KvEventsEndpoint,
        index: KvIndex,
        context: zmq.asyncio.Context,
        *,
        replay_timeout_s: float = 2.0,
        quiet_probe_s: float = 5.0,
    ) -> None:
        self.replica_id = replica_id
        self.endpoint = endpoint
        self._index = index
        self._context = context
        self._replay_timeout_s = replay_timeout_s
        self._quiet_probe_s = quiet_probe_s
        self._last_ts: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.batches_applied = 0
        self.resyncs = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kv-events-{self.replica_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        """Follow the stream; after a failure (a malformed message), start again from a new
        socket a little later, the replica guessed meanwhile."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a malformed message costs exactness, not the gateway
                log.warning("KV events from %s failed: %s", self.replica_id, exc)
                self._index.detach(
                    self.replica_id, f"KV events from {self.replica_id} failed: {exc}"
                )
            await asyncio.sleep(self._quiet_probe_s)

    async def _follow(self) -> None:
        sub: zmq.Socket[bytes] = zmq.Socket(self._context, zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, _RECV_HWM)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoint.publish)
        reader = LoopReader(sub)
        try:
            await self._probe()
            while True:
                messages = await reader.receive(self._quiet_probe_s)
                if not messages:
                    await self._probe()
                for frames in messages:
                    if len(frames) != 3:
                        raise ValueError(f"a message of {len(frames)} frames, not 3")
                    await self._live(decode_batch(frames[1], frames[2]))
        finally:
            reader.close()

    async def _live(self, batch: Batch) -> None:
        applied = self._apply(batch)
        if applied is Applied.GAP:
            log.info("KV events from %s: gap before batch %d", self.replica_id, batch.seq)
            await self._probe()
            self._apply(batch)

    def _apply(self, batch: Batch) -> Applied:
        applied = self._index.apply(self.replica_id, batch.seq, batch.events)
        if applied is not Applied.DUPLICATE and applied is not Applied.GAP:
            self._last_ts = batch.ts
            self.batches_applied += 1
        return applied

    async def _probe(self) -> None:
        """Ask the replay socket from the last applied batch; catch up, or rebuild."""
        last = self._index.expected_seq(self.replica_id) - 1
        replayed = await self._replay(max(last, 0))
        if replayed is None:
            self._index.detach(self.replica_id, f"KV events are not flowing from {self.replica_id}")
            return
        in_step = replayed and replayed[0].seq == last and replayed[0].ts == self._last_ts
        if last >= 0 and not in_step:
            # Restarted (its count began again) or its buffer moved past us: its whole buffer
            # is all that can be known now.
            self.resyncs += 1
            log.info("KV events from %s: resynchronising", self.replica_id)
            replayed = await self._replay(0)
            if replayed is None:
                self._index.detach(self.replica_id, f"KV events from {self.replica_id} stopped")
                return
            self._index.resync(self.replica_id, replayed[0].seq if replayed else 0)
        self._index.attach(self.replica_id)
        for batch in replayed:
            self._apply(batch)

    async def _replay(self, start_seq: int) -> list[Batch] | None:
        """The publisher's buffered batches from `start_seq`; None if it did not answer."""
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.endpoint.replay)
        batches: list[Batch] = []
        try:
            await dealer.send_multipart((b"", start_seq.to_bytes(8, "big")))
            while True:
                if not await dealer.poll(self._replay_timeout_s * 1000):
                    return None
                frames = await dealer.recv_multipart()
                if len(frames) != 4:
                    # Not vLLM's replay: with nothing listening on the port, a TCP connect to
                    # it from that same port can meet itself, and the request comes back.
                    return None
                seq_bytes, payload = frames[2], frames[3]
                if int.from_bytes(seq_bytes, "big", signed=True) == _END_SEQ:
                    return batches
                batches.append(decode_batch(seq_bytes, payload))
        finally:
            dealer.close(linger=0)


class KvEventFeeds:
    """Every replica's feed, owned by the gateway: started as replicas join, stopped as they
    leave, all stopped (before the ZMQ context ends) when the gateway stops."""

    def __init__(self, index: KvIndex, *, quiet_probe_s: float = 5.0) -> None:
        """`quiet_probe_s`: how long a feed's stream may be silent before its replay socket
        is asked whether the replica is still there (and what it missed)."""
        self.index = index
        self._quiet_probe_s = quiet_probe_s
        self._context: zmq.asyncio.Context | None = None
        self._feeds: dict[str, KvEventFeed] = {}
        self._learning: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def subscribe(self, replica_id: str, endpoint: KvEventsEndpoint) -> None:
        """Follow the replica's events (again: a replica back at new ports is followed
        there, from nothing)."""
        if replica_id in self._feeds:
            if self._feeds[replica_id].endpoint == endpoint:
                return
            self.unsubscribe(replica_id)
        if self._context is None:
            self._context = zmq.asyncio.Context()
        self.index.detach(replica_id, f"KV events from {replica_id} not received yet")
        feed = KvEventFeed(
            replica_id, endpoint, self.index, self._context, quiet_probe_s=self._quiet_probe_s
        )
        self._feeds[replica_id] = feed
        feed.start()

    def learn(self, replica_id: str, url: str, ask: Ask) -> None:
        """Follow the replica's events once it says where it publishes them (`ask`: its
        /kv_event_sources), asked again every quiet probe interval until it answers (it may
        still be loading); a replica that publishes none is guessed, and `status` says why."""
        if replica_id in self._feeds or replica_id in self._learning:
            return
        self.index.detach(replica_id, f"{replica_id} has not said where it publishes KV events")
        task = asyncio.create_task(
            self._learn(replica_id, url, ask), name=f"kv-sources-{replica_id}"
        )
        self._learning[replica_id] = task
        task.add_done_callback(functools.partial(self._learnt, replica_id))

    def _learnt(self, replica_id: str, task: asyncio.Task[None]) -> None:
        if self._learning.get(replica_id) is task:  # not a later learn of the same id
            del self._learning[replica_id]

    async def _learn(self, replica_id: str, url: str, ask: Ask) -> None:
        while True:
            answer = await ask()
            found = None if answer is None else endpoint_from_sources(replica_id, url, *answer)
            if isinstance(found, NoKvEvents):
                log.info("prefix cache of %s guessed: %s", replica_id, found.why)
                self.index.detach(replica_id, found.why)
                return
            if found is not None:
                self._learning.pop(replica_id, None)  # not cancelled by the subscribe below
                self.subscribe(replica_id, found)
                return
            await asyncio.sleep(self._quiet_probe_s)

    def unsubscribe(self, replica_id: str) -> None:
        """Stop following the replica and forget its blocks (it left the pool)."""
        learning = self._learning.pop(replica_id, None)
        if learning is not None:
            learning.cancel()
            self._stopping.add(learning)
            learning.add_done_callback(self._stopping.discard)
        feed = self._feeds.pop(replica_id, None)
        if feed is not None:
            stopping = asyncio.ensure_future(feed.stop())
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)
        self.index.forget(replica_id)

    def feed(self, replica_id: str) -> KvEventFeed | None:
        return self._feeds.get(replica_id)

    def replica_ids(self) -> list[str]:
        return sorted(self._feeds)

    def describe(self, replica_id: str) -> dict[str, str]:
        """The admin API's account of the replica's prefix cache: exact or guessed, and why."""
        feed = self._feeds.get(replica_id)
        doc = (
            {}
            if feed is None
            else {"kv_events": feed.endpoint.publish, "kv_replay": feed.endpoint.replay}
        )
        why = self.index.why_not_exact(replica_id)
        if why is None:
            return doc | {"prefix_index": "exact"}
        return doc | {"prefix_index": "guessed", "prefix_index_why": why}

    async def close(self) -> None:
        for replica_id in {*self._feeds, *self._learning}:
            self.unsubscribe(replica_id)
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        if self._context is not None:
            self._context.term()
            self._context = None


class KvIndexCollector:
    """`servepilot_prefix_index_exact{replica}`: 1 where the replica's KV events flow, 0 where
    its prefix cache is guessed (what `doctor` reads); the blocks each holds, by the index;
    the batches of events applied from each (each one a message the gateway read: their rate
    is what following the replica costs)."""

    def __init__(self, feeds: KvEventFeeds) -> None:
        self._feeds = feeds

    def collect(self) -> Iterator[Metric]:
        index = self._feeds.index
        exact = GaugeMetricFamily(
            "servepilot_prefix_index_exact",
            "1 where the replica's KV events flow (its prefix cache is known), 0 where it is "
            "guessed from what was sent there",
            labels=["replica"],
        )
        blocks = GaugeMetricFamily(
            "servepilot_prefix_index_blocks",
            "KV blocks the replica holds, by its KV events",
            labels=["replica"],
        )
        batches = CounterMetricFamily(
            "servepilot_kv_event_batches",
            "Batches of KV events applied from the replica (one published message each)",
            labels=["replica"],
        )
        for replica_id in self._feeds.replica_ids():
            exact.add_metric([replica_id], float(index.is_exact(replica_id)))
            blocks.add_metric([replica_id], float(index.blocks_held(replica_id)))
            feed = self._feeds.feed(replica_id)
            batches.add_metric([replica_id], float(feed.batches_applied if feed else 0))
        yield exact
        yield blocks
        yield batches
