"""The replica model in real time: one task steps it and hands each step's tokens out.

The loop is vLLM's engine loop with the GPU replaced by a sleep: `step(start)` schedules the
next step and says when it ends; the task sleeps until then (monotonic clock), then gives
one token to every request that got one, and steps again. Timing, so that a client sees the
model's times to within about a millisecond:
- Steps run back to back on the model's own clock (each starts when the last one ended), so
  the lateness of one wake-up delays that step's delivery but never the steps after it. Only
  when the process falls more than `MAX_LAG_S` behind (a host too busy to keep up) does the
  model's clock jump to the present.
- A request's arrival is when its last byte was read, and an idle engine's first step starts
  then, not after the request was parsed and tokenized (which would add that work to its
  TTFT: about a millisecond for a long prompt).
- The sleep aims `EARLY_S` before a step's end: asyncio rounds a timer's wait up to a whole
  millisecond, so this centres the delivery error on zero instead of +0.5 ms.

KV events (with a publisher): what a step stored and evicted leaves as one batch once the
step has run, as vLLM publishes its scheduler's events after each step, with the prefix
groups dropped since the step before (prefixmap.py).

Requests that arrive while a step runs wait for the next one, as in vLLM. With async
scheduling a step's tokens are handed out once the next step is launched (`HostClock`: a
step too large for a CUDA graph holds back the tokens of the step before it). With nothing
to run the task waits on an event, so an idle replica costs no CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from servepilot.engine.simserver.metrics import Gauges, ServerStats
from servepilot.engine.simserver.prefixmap import PrefixMap
from servepilot.routing.kv_index import DEFAULT_SEED, BlockHashing, KvEvent
from servepilot.sim.engine.chainevents import chain_records
from servepilot.sim.engine.hostclock import HostClock, hold_back
from servepilot.sim.engine.records import StepResult
from servepilot.sim.engine.replica import ReplicaModel
from servepilot.sim.engine.request import SimRequest

MAX_LAG_S = 0.05
EARLY_S = 0.0005


class TokenSink(Protocol):
    """Where a request's tokens go (an HTTP response)."""

    def token(self, index: int) -> None:
        """Token number `index` (0-based) was generated."""

    def finish(self) -> None:
        """The last token was generated (after its `token` call)."""


class KvEventSink(Protocol):
    """Where the replica's KV events go (its ZMQ publisher)."""

    def publish(self, events: Sequence[KvEvent]) -> None:
        """One batch of events, in order."""


class _Live:
    __slots__ = ("produced", "request", "sink")

    def __init__(self, sink: TokenSink, request: SimRequest) -> None:
        self.sink = sink
        self.request = request
        self.produced = 0


Stepped = tuple[StepResult, list[int]]
"""A step that ran, and the requests it gave a token to (read right after `step()`)."""


class RealtimeEngine:
    """Drives one `ReplicaModel` in real time; create and use it inside one event loop."""

    def __init__(
        self,
        model: ReplicaModel,
        *,
        clock: Callable[[], float] = time.monotonic,
        hash_seed: str = DEFAULT_SEED,
        kv_events: KvEventSink | None = None,
    ) -> None:
        """`hash_seed`: vLLM's NONE_HASH seed (the replica's PYTHONHASHSEED, if set), so its
        blocks hash as the gateway keys them. `kv_events`: publish its KV events there."""
        self.model = model
        self.stats = ServerStats()
        self._clock = clock
        self._t0 = clock()
        self._live: dict[int, _Live] = {}
        self._host = HostClock(model.cost, model.async_scheduling)
        self._ids = itertools.count(1)
        config = model.config
        self._kv_events = kv_events
        self._kv_queue: list[KvEvent] = []
        """Events of the prefix map (groups dropped) waiting for the next batch."""
        self._prefixes: PrefixMap | None = None
        if config.enable_prefix_caching:
            on_drop = None if kv_events is None else self._kv_queue.append
            hashing = BlockHashing(config.block_size, hash_seed)
            self._prefixes = PrefixMap(hashing, on_drop=on_drop)
        if kv_events is not None:
            model.listen_kv_events()
        self._wake = asyncio.Event()
        self._woken_by = 0.0
        """Arrival of the request that woke the idle engine (the model's clock)."""
        self._last_end = 0.0
        self._stepping = False
        """A step is in progress (planned, its end not yet reached)."""
        self._deferred: list[SimRequest] = []
        """With async scheduling: requests that arrived during the step in progress."""
        self._task: asyncio.Task[None] | None = None
        self.steps_late = 0
        """Steps whose start had to jump to the present (the host fell behind)."""

    def now(self) -> float:
        """Seconds on the model's clock (since this engine was created)."""
        return self._clock() - self._t0

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def start(self) -> asyncio.Task[None]:
        """Start the step loop; the task ends only when cancelled or on a bug."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self._task

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def gauges(self) -> Gauges:
        m = self.model
        return Gauges(
            running=m.num_running,
            waiting=m.num_waiting,
            kv_usage=m.kv_usage,
            prefix_queries=m.prefix_cache_queries,
            prefix_hits=m.prefix_cache_hits,
            preemptions=m.num_preemptions,
        )

    def submit(
        self,
        prompt_ids: list[int],
        output_tokens: int,
        sink: TokenSink,
        *,
        arrived_at: float | None = None,
    ) -> int:
        """Queue a request that arrived at `arrived_at` (the engine's clock, default now);
        returns its id (for `abort`). ValueError for what the model refuses (the HTTP layer
        checks lengths first)."""
        now = self.now()
        arrival = now if arrived_at is None else min(now, arrived_at - self._t0)
        group, prefix = (None, 0) if self._prefixes is None else self._prefixes.assign(prompt_ids)
        request_id = next(self._ids)
        request = SimRequest(
            request_id,
            prompt_tokens=len(prompt_ids),
            output_tokens=output_tokens,
            arrival_s=arrival,
            prefix_group=group,
            prefix_tokens=prefix,
        )
        if self._stepping and self.model.async_scheduling:
            # vLLM planned the next step when this one started: see `_run`.
            self.model.validate(request)
            self._deferred.append(request)
        else:
            self.model.add(request)
        self._live[request_id] = _Live(sink, request)
        if not self._wake.is_set():
            self._woken_by = arrival
            self._wake.set()
        return request_id

    def drop_prefix_cache(self) -> None:
        """No later prompt hits what earlier ones cached (the cache sleep drops); the blocks
        left behind count as free already and are evicted as new requests need room."""
        if self._prefixes is not None:
            self._prefixes.forget()
            self._publish_kv_events()  # no step may follow soon (a sleep)

    def _publish_kv_events(self) -> None:
        """What the model's chains stored and evicted, and the groups the prefix map dropped,
        since the last batch: the next batch, if any."""
        if self._kv_events is None:
            return
        events = list(self._kv_queue)
        self._kv_queue.clear()
        notes = self.model.take_kv_events()
        if notes and self._prefixes is not None:
            events += chain_records(notes, self.model.config.block_size, self._prefixes)
        if events:
            self._kv_events.publish(events)

    def abort(self, request_id: int) -> None:
        """The client went away: the request leaves the model (its blocks are freed)."""
        if self._live.pop(request_id, None) is None:
            return
        self.model.abort(request_id)
        self.stats.aborted += 1

    async def _run(self) -> None:
        model, host = self.model, self._host
        last_end: float | None = None  # None: the engine was idle before this step
        pending: Stepped | None = None  # ended, its tokens not handed out yet
        while True:
            if model.idle:
                if pending is not None:  # no step after it to launch
                    await self._hand_out(pending, launching=False)
                    pending = None
                self._stepping = False
                last_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.now()
            if last_end is None:  # idle until a request came: start at its arrival
                start = max(self._woken_by, self._last_end)
            elif now - last_end <= MAX_LAG_S:
                start = last_end  # back to back, on the model's clock
            else:
                start = now
                self.steps_late += 1
            lead = host.lead_s(start) if last_end is not None else 0.0
            result = model.step(start, lead)
            # With async scheduling what arrived during the last step waits for the step
            # after this one (vLLM's EngineCore.step_with_batch_queue): it joins the model now,
            # with this step already planned.
            late, self._deferred = self._deferred, []
            for request in late:
                if request.request_id in self._live:  # not aborted meanwhile
                    model.add(request)
            # Read right after step(): which requests this step gives a token to.
            got_token = model.last_step_token_ids(result) if result is not None else []
            if result is not None:
                host.launched(result, start - lead)
            if pending is not None:
                await self._hand_out(pending, launching=result is not None)
                pending = None
            if result is None:
                self._stepping = False
                last_end = None
                continue
            self._stepping = True
            self._last_end = result.end_s
            delay = result.end_s - EARLY_S - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            self._publish_kv_events()
            last_end = result.end_s
            pending = (result, got_token)

    def _live_request(self, request_id: int) -> SimRequest | None:
        entry = self._live.get(request_id)
        return entry.request if entry is not None else None

    async def _hand_out(self, stepped: Stepped, *, launching: bool) -> None:
        """The step's tokens leave the engine: at its end, or once the next step (`launching`)
        is launched."""
        result, got_token = stepped
        out_s, gap_s = self._host.emitted(result.end_s, launching)
        if out_s > result.end_s:
            hold_back(result, self._live_request, out_s - result.end_s)
            delay = out_s - EARLY_S - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
        self._deliver(result, got_token, out_s, gap_s)

    def _deliver(
        self, result: StepResult, got_token: list[int], out_s: float, gap_s: float
    ) -> None:
        stats, live = self.stats, self._live
        stats.generation_tokens += result.tokens
        if result.decode_seqs:
            stats.itl.observe(gap_s, result.decode_seqs)
        for gap in result.resumed_gaps_s:
            stats.itl.observe(gap + out_s - result.end_s)
        for request_id in result.first_tokens:
            entry = live.get(request_id)
            if entry is not None:  # as vLLM: counted at the first token
                stats.prompt_tokens += entry.request.prompt_tokens
                stats.ttft.observe(out_s - entry.request.arrival_s)
        for request in result.finished:
            stats.finished += 1
            if request.e2e_s is not None:
                stats.e2e.observe(request.e2e_s)
            if request.tpot_s is not None:
                stats.tpot.observe(request.tpot_s)
            scheduled_s, first_s = request.scheduled_s, request.first_token_s
            if scheduled_s is not None and first_s is not None:
                # As vLLM: observed when the request ends, on the engine's (model's) clock.
                stats.queue.observe(scheduled_s - request.arrival_s)
                stats.prefill.observe(first_s - scheduled_s)
        for request_id in got_token:
            entry = live.get(request_id)
            if entry is None:  # aborted while the step ran
                continue
            entry.sink.token(entry.produced)
            entry.produced += 1
        for request in result.finished:
            entry = live.pop(request.request_id, None)
            if entry is not None:
                entry.sink.finish()
