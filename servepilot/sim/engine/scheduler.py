"""The core of the replica simulator: vLLM v1's scheduling loop, over aggregates.

`SchedulerCore` holds the state and runs `step`; `ReplicaModel` (replica.py) adds the request
API and vLLM's numbers. Rules: vLLM 0.32's `Scheduler.schedule` (FCFS; replica.py says more).

Why the state looks the way it does: a fleet simulation runs ten million steps, so a step
must cost O(requests that start, finish or are preempted in it), never O(running).
Decoding requests are therefore not visited per step. They are held in aggregate: their
count, the sum of their tokens in KV, and `_crossing`, how many sit at each position within
a block, so that the number needing a new block this step is one lookup (a decoder with
t tokens in KV needs one when t % block_size == 0, and t grows by one per step). Each
decoder stores `_base` = step - t, from which its tokens in KV at any step follow; its
finishing step is known when it starts decoding, and it is filed under that step.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from servepilot.plan.costmodel import CostModel
from servepilot.sim.engine.kvblocks import BlockPool
from servepilot.sim.engine.records import SchedulerConfig, StepResult
from servepilot.sim.engine.request import RequestState, SimRequest
from servepilot.sim.engine.sharing import SharedPrefixReads
from servepilot.sim.engine.steptime import StepTime

_WAITING: Final = RequestState.WAITING
_PREFILLING: Final = RequestState.PREFILLING
_DECODING: Final = RequestState.DECODING
_FINISHED: Final = RequestState.FINISHED


class SchedulerCore:
    """The scheduler's state and its step (see `ReplicaModel` for how to drive it)."""

    def __init__(self, config: SchedulerConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost
        self._bs = config.block_size
        self._caching = config.enable_prefix_caching
        self._pool = BlockPool(config.num_blocks, config.block_size, caching=self._caching)
        self._time = StepTime(cost)
        self._requests: dict[int, SimRequest] = {}
        self._waiting: deque[SimRequest] = deque()
        self._num_waiting = 0
        self._running: dict[int, SimRequest] = {}
        """In admission order: preemption takes from the end."""
        self._prefilling: SimRequest | None = None
        """The running request whose prefill is not done: at most one, the last admitted."""
        self._num_decoding = 0
        self._decode_context = 0
        """Over decoding requests, their tokens in KV at the start of the next step."""
        self._shared = SharedPrefixReads(self._bs)
        """With prefix caching: of `_decode_context`, what a step reads once (sharing.py)."""
        self._crossing = [0] * self._bs
        """Decoders by (step - tokens in KV) mod block_size: those at step % block_size
        start a new block this step."""
        self._finishing: dict[int, list[SimRequest]] = {}
        self._async = config.async_scheduling
        self._draining: list[SimRequest] = []
        """With async scheduling: finished in the last step, released after this one's
        scheduling (when vLLM processes the last step's output)."""
        self._step = 0
        self._last_end_s = 0.0
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        """Tokens looked up in the prefix cache by new requests (vLLM's counter)."""
        self.prefix_cache_hits = 0
        self.preempted_prefix_queries = 0
        self.preempted_prefix_hits = 0

    @property
    def async_scheduling(self) -> bool:
        return self._async

    def step(self, now_s: float, lead_s: float = 0.0) -> StepResult | None:
        """Plan and run one engine step starting at `now_s`; None when idle. Its launch may
        start `lead_s` before (async scheduling; negative: the host is busy until after)."""
        if now_s < self._last_end_s:
            raise ValueError(f"step at {now_s} starts before the last one ended")
        running = self._running
        if not running and not self._num_waiting:
            return None
        if len(running) == len(self._draining) and not self._num_waiting:
            self._drain()
            return None
        self._step += 1
        preempted: list[int] = []
        scheduled: list[SimRequest] = []
        context = self._plan(preempted, scheduled)
        if context < 0:
            return self._replan(now_s, preempted, lead_s)
        decode_seqs = self._num_decoding
        prefill_tokens = pairs = 0
        for request in scheduled:
            if request.scheduled_s is None:  # vLLM stamps it as it schedules: at the launch
                request.scheduled_s = now_s - lead_s
            chunk = request._chunk
            prefill_tokens += chunk
            pairs += chunk * request._computed + chunk * (chunk + 1) // 2  # prefill_pairs()
        duration = self._time.duration_s(
            prefill_tokens, len(scheduled), decode_seqs, context, pairs, lead_s
        )
        end = now_s + duration
        self._decode_context += decode_seqs
        bucket = self._finishing.pop(self._step, None)
        finished = self._finish_decoders(bucket, end) if bucket is not None else []
        first: tuple[int, ...] = ()
        gaps: tuple[float, ...] = ()
        if scheduled:
            first, gaps = self._advance_prefills(scheduled, end, finished)
        itl = end - self._last_end_s
        self._last_end_s = end
        return StepResult(
            now_s,
            duration,
            prefill_tokens,
            len(scheduled),
            decode_seqs,
            context,
            pairs,
            decode_seqs + len(first) + len(gaps),
            itl,
            first,
            tuple(finished) if finished else (),
            tuple(preempted) if preempted else (),
            gaps,
        )

    def _plan(self, preempted: list[int], scheduled: list[SimRequest]) -> int:
        """Schedule this step: blocks for the decoders, the running prefill's next chunk,
        then waiting requests. Returns the context tokens the step reads, or -1 when it
        runs nothing (all preempted, or only finished requests left to drain)."""
        if self._num_decoding:
            need = self._crossing[self._step % self._bs]
            if need:
                pool = self._pool
                if need <= pool.free_uncached:
                    pool.free_uncached -= need
                else:
                    self._allocate_decode_blocks(need, preempted)
        decode_seqs = self._num_decoding
        context = self._decode_context - self._shared.reread
        budget = self.config.max_num_batched_tokens - decode_seqs
        prefilling = self._prefilling
        if prefilling is not None:
            if self._continue_prefill(prefilling, budget):
                scheduled.append(prefilling)
                context += prefilling._computed
                budget -= prefilling._chunk
            else:
                preempted.append(prefilling.request_id)
        if preempted:
            if not decode_seqs and not scheduled:
                return -1
        elif self._num_waiting and len(self._running) < self.config.max_num_seqs:
            context += self._schedule_waiting(budget, scheduled)
        if self._draining:
            self._drain()
            if not decode_seqs and not scheduled:
                return -1  # vLLM's empty step: it takes no time
        return context

    def _replan(self, now_s: float, preempted: list[int], lead_s: float) -> StepResult | None:
        """Nothing ran (all preempted, or only finished left): schedule again at once."""
        self._step -= 1
        result = self.step(now_s, lead_s)
        if preempted and result is not None:
            result.preempted = (*preempted, *result.preempted)
        return result

    def _drain(self) -> None:
        """Async scheduling: the last step's finished requests leave (unless preempted)."""
        running, pool = self._running, self._pool
        for request in self._draining:
            if running.pop(request.request_id, None) is not None:
                pool.release(request, request._computed, keep_own=False)
        self._draining = []

    def _allocate_decode_blocks(self, need: int, preempted: list[int]) -> None:
        """`need` decoders start a new block this step; while the free blocks fall short,
        preempt the last running request (vLLM's victim)."""
        pool = self._pool
        running = self._running
        step, size = self._step, self._bs
        while need > pool.free_uncached + pool.evictable:
            victim = running.pop(next(reversed(running)))
            if victim.state is _FINISHED:
                # Async scheduling: finished, its output not processed yet. vLLM preempts
                # it (and counts it), then finishes it when the output comes in.
                pool.release(victim, victim._computed, keep_own=False)
                self.num_preemptions += 1
                preempted.append(victim.request_id)
                continue
            if victim.state is _DECODING and (step - victim._base) % size == 0:
                need -= 1
            self._preempt(victim)
            preempted.append(victim.request_id)
        pool.take(need)

    def _continue_prefill(self, request: SimRequest, budget: int) -> bool:
        """The running prefill's next chunk; False when its blocks do not fit and it was
        preempted (it is the last running request, so vLLM's victim is itself)."""
        size = self._bs
        computed = request._computed
        chunk = min(request._num_tokens - computed, budget)
        blocks = -(-(computed + chunk) // size) - -(-computed // size)
        pool = self._pool
        if blocks > pool.free_uncached + pool.evictable:
            del self._running[request.request_id]
            self._preempt(request)
            return False
        pool.take(blocks)
        request._chunk = chunk
        if request._prefix_blocks:
            pool.register(request, computed + chunk)
        return True

    def _preempt(self, request: SimRequest) -> None:
        """Free a running request's blocks and queue it at the front to be recomputed."""
        if request.state is _DECODING:
            kv_tokens = self._step - request._base
            self._leave_decoding(request, kv_tokens)
            cached = kv_tokens
            if self._async and kv_tokens > request._num_tokens:
                # vLLM caches a decoder's blocks as its outputs are processed, which async
                # scheduling leaves a step behind: the newest token's block is not cached.
                cached -= 1
            # It recomputes all it has: the prompt and its output, the last token included.
            request._num_tokens = kv_tokens + 1
            request._last_token_s = self._last_end_s
        else:
            kv_tokens = cached = request._computed
            if self._prefilling is request:
                self._prefilling = None
        self._pool.release(request, kv_tokens, keep_own=True, cached_tokens=cached)
        request._computed = 0
        request._chunk = 0
        request.state = _WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(request)
        self._num_waiting += 1

    def _leave_decoding(self, request: SimRequest, kv_tokens: int) -> None:
        self._num_decoding -= 1
        self._decode_context -= kv_tokens
        self._crossing[request._base % self._bs] -= 1
        if request._prefix_blocks and self._caching:
            self._shared.leave(request)

    def _schedule_waiting(self, budget: int, scheduled: list[SimRequest]) -> int:
        """Admit waiting requests in FCFS order; returns the context their chunks read
        (their prefix-cache hits)."""
        waiting, running, pool = self._waiting, self._running, self._pool
        size, caching = self._bs, self._caching
        max_seqs = self.config.max_num_seqs
        chunked = self.config.enable_chunked_prefill
        context = 0
        while budget > 0 and self._num_waiting and len(running) < max_seqs:
            request = waiting[0]
            if request.state is not _WAITING:  # aborted while waiting
                waiting.popleft()
                continue
            num_tokens = request._num_tokens
            looks_up = caching and (request._prefix_blocks or request._own_segment is not None)
            hit, evictable = pool.lookup(request) if looks_up else (0, 0)
            hit_tokens = hit * size
            chunk = num_tokens - hit_tokens
            if chunk > budget:
                if not chunked:
                    break
                chunk = budget
            # scheduler_reserve_full_isl: the whole sequence must fit, not just this chunk.
            if -(-num_tokens // size) - hit + evictable > pool.free_uncached + pool.evictable:
                break
            waiting.popleft()
            self._num_waiting -= 1
            if caching:
                if request.num_preemptions:
                    self.preempted_prefix_queries += num_tokens
                    self.preempted_prefix_hits += hit_tokens
                else:
                    self.prefix_cache_queries += num_tokens
                    self.prefix_cache_hits += hit_tokens
                if looks_up:
                    pool.touch(request, hit)
            blocks = -(-(hit_tokens + chunk) // size) - hit
            if blocks <= pool.free_uncached:
                pool.free_uncached -= blocks
            else:
                pool.take(blocks)
            request._computed = hit_tokens
            request._chunk = chunk
            request.state = _PREFILLING
            if request._prefix_blocks:
                pool.register(request, hit_tokens + chunk)
            running[request.request_id] = request
            scheduled.append(request)
            context += hit_tokens
            budget -= chunk
            if chunk < num_tokens - hit_tokens:
                self._prefilling = request
        return context

    def _finish_decoders(self, bucket: list[SimRequest], end_s: float) -> list[SimRequest]:
        """The decoders filed under this step produced their last token (entries left by a
        preemption or an abort are skipped)."""
        step = self._step
        after = step + 1
        finished = []
        for request in bucket:
            if request.state is _DECODING and request._finish_at == step:
                kv_tokens = after - request._base
                self._leave_decoding(request, kv_tokens)
                self._finish(request, kv_tokens, end_s)
                finished.append(request)
        return finished

    def _advance_prefills(
        self, scheduled: list[SimRequest], end_s: float, finished: list[SimRequest]
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Chunks are computed; a prefill that is done produced a token. Returns the ids
        with a first token, and the gaps of those resuming after a preemption."""
        step = self._step
        first: list[int] = []
        gaps: list[float] = []
        for request in scheduled:
            computed = request._computed + request._chunk
            request._computed = computed
            request._chunk = 0
            if computed < request._num_tokens:
                continue
            if request.first_token_s is None:
                request.first_token_s = end_s
                request.first_token_step = step
                first.append(request.request_id)
            else:
                gaps.append(end_s - request._last_token_s)
            if self._start_decoding(request, computed):
                self._finish(request, computed, end_s)
                finished.append(request)
        prefilling = self._prefilling
        if prefilling is not None and prefilling.state is not _PREFILLING:
            self._prefilling = None
        return (tuple(first) if first else ()), (tuple(gaps) if gaps else ())

    def _start_decoding(self, request: SimRequest, computed: int) -> bool:
        """A prefill ended with a token; True when that was its last one."""
        remaining = request.output_tokens - (computed - request.prompt_tokens + 1)
        if remaining <= 0:
            return True
        step = self._step
        request.state = _DECODING
        request._base = base = step + 1 - computed
        self._num_decoding += 1
        self._decode_context += computed
        self._crossing[base % self._bs] += 1
        if request._prefix_blocks and self._caching:
            self._shared.join(request)
        finish_at = request._finish_at = step + remaining
        bucket = self._finishing.get(finish_at)
        if bucket is None:
            self._finishing[finish_at] = [request]
        else:
            bucket.append(request)
        return False

    def _finish(self, request: SimRequest, kv_tokens: int, end_s: float) -> None:
        del self._requests[request.request_id]
        if self._async:
            request._computed = kv_tokens
            self._draining.append(request)
        else:
            del self._running[request.request_id]
            self._pool.release(request, kv_tokens, keep_own=False)
        request.state = _FINISHED
        request.finish_s = end_s
        request.finish_step = self._step
