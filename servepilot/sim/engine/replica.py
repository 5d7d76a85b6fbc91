"""One vLLM v1 engine, step by step: its scheduler, its KV blocks, its step times.

`ReplicaModel` follows vllm/v1/core/sched/scheduler.py (`Scheduler.schedule`, vLLM 0.32)
with the default FCFS policy:
1. Running requests first, in the order they were admitted: each gets the tokens it still
   needs (1 when decoding) within the step's token budget (max_num_batched_tokens), and the
   KV blocks for them. When blocks run out, the last running request is preempted (its
   blocks freed, itself put at the front of the waiting queue to recompute its prompt and
   output so far) until the rest fit.
2. Then, only if nothing was preempted, waiting requests in FCFS order while the budget,
   max_num_seqs and the free blocks allow. A prefix-cache hit is skipped (the last token is
   always computed); the rest is the request's prefill, split over steps with chunked
   prefill (without it a prompt must fit the remaining budget whole, or admission stops).
   As with vLLM's default scheduler_reserve_full_isl, the whole sequence must fit in the
   free blocks to be admitted.
3. The step takes the cost model's time for its shape. A prefill's last chunk produces the
   request's first token; each decoding request produces one token per step. The context a
   step's decoders read counts a cached prefix they share once (sharing.py).
With `async_scheduling` (vLLM's default on GPUs), the next step is scheduled before the
last one's output is processed (vLLM's EngineCore.step_with_batch_queue): a finished
request keeps its slot and blocks through one more scheduling, and a preempted decoder's
newest block was not cached yet. tests/unit/test_sim_replica_vllm.py drives vLLM's own Scheduler
(and AsyncScheduler) side by side and checks both schedule the same tokens, preempt and finish
the same requests and use the same blocks, step by step.

Speed: a step costs O(requests that start, finish or are preempted in it), not O(running)
(scheduler.py says how).

Not modelled: the priority policy, long_prefill_token_threshold and max_num_partial_prefills
(off by default), speculative decoding, pipeline parallelism, KV connectors and offloading,
encoder inputs, sliding-window and hybrid KV groups (one group of full-attention blocks),
EOS and stop strings (a request produces exactly `output_tokens`). Time: async scheduling
overlaps vLLM's CPU work with the GPU's; the cost model's per-step overhead stands for what
is left of it (a calibrated profile measures it).
"""

from __future__ import annotations

from typing import Final

from servepilot.sim.engine.kvblocks import ChainNote
from servepilot.sim.engine.records import StepResult
from servepilot.sim.engine.request import RequestState, SimRequest
from servepilot.sim.engine.scheduler import SchedulerCore

_WAITING: Final = RequestState.WAITING
_DECODING: Final = RequestState.DECODING


class ReplicaModel(SchedulerCore):
    """One engine. Pure: time comes in as `now_s`; nothing reads a clock.

    Drive it like vLLM's engine loop: `add` requests at any time, and `step(now_s)` plans
    and runs the next step starting at `now_s` (not before the previous step's end),
    returning at once what the step will have done by `result.end_s`. Requests added in
    the meantime wait for the next step. `step` returns None when there is nothing to run.
    """

    # ---- what vLLM exports -------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running) - len(self._draining)

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def kv_usage(self) -> float:
        """vLLM's kv_cache_usage_perc, 0..1 (cached blocks nobody uses count as free)."""
        pool = self._pool
        return 1.0 - pool.free / pool.usable

    @property
    def prefix_hit_rate(self) -> float:
        """Hit tokens / queried tokens over new requests (vLLM leaves preempted ones out)."""
        queries = self.prefix_cache_queries
        return self.prefix_cache_hits / queries if queries else 0.0

    @property
    def steps(self) -> int:
        return self._step

    @property
    def idle(self) -> bool:
        return len(self._running) == len(self._draining) and not self._num_waiting

    # ---- requests ----------------------------------------------------------------------

    def add(self, request: SimRequest) -> None:
        """Queue a request; ValueError for what vLLM's server refuses (400) or a reused one."""
        self.validate(request)
        request._num_tokens = request.prompt_tokens
        if self._caching and request.prefix_group is not None:
            request._prefix_blocks = request.prefix_tokens // self._bs
        self._requests[request.request_id] = request
        self._waiting.append(request)
        self._num_waiting += 1

    def validate(self, request: SimRequest) -> None:
        """ValueError for what `add` would refuse, without adding it (a request the engine
        takes a step later is refused as it arrives, as vLLM's server does)."""
        prompt = request.prompt_tokens
        if (
            prompt < 1
            or request.output_tokens < 1
            or prompt + request.output_tokens > self.config.max_model_len
            or not 0 <= request.prefix_tokens <= prompt
            or request._num_tokens
            or request.request_id in self._requests
        ):
            self._reject(request)

    def _reject(self, request: SimRequest) -> None:
        name = f"request {request.request_id}"
        if request._num_tokens or request.request_id in self._requests:
            raise ValueError(f"{name} was already added")
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError(f"{name}: prompt and output need at least one token each")
        if not 0 <= request.prefix_tokens <= request.prompt_tokens:
            raise ValueError(f"{name}: prefix_tokens must lie within the prompt")
        total = request.prompt_tokens + request.output_tokens
        raise ValueError(
            f"{name}: {total} tokens (prompt + output) exceed max_model_len "
            f"{self.config.max_model_len}"
        )

    def abort(self, request_id: int) -> None:
        """Drop a request (its client went away); unknown or finished ids are ignored."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        state = request.state
        request.state = RequestState.ABORTED
        if state is _WAITING:
            self._num_waiting -= 1  # stays in the deque until it reaches the front
            if request._own_segment is not None:
                request._own_segment.owner = None
                request._own_segment = None
            return
        del self._running[request_id]
        if state is _DECODING:
            kv_tokens = self._step + 1 - request._base
            self._leave_decoding(request, kv_tokens)
        else:
            kv_tokens = request._computed
            if self._prefilling is request:
                self._prefilling = None
        self._pool.release(request, kv_tokens, keep_own=False)

    # ---- KV events ---------------------------------------------------------------------

    def listen_kv_events(self) -> None:
        """Note the prefix chains' blocks stored and evicted from now on (kvblocks.py)."""
        if self._pool.events is None:
            self._pool.events = []

    def take_kv_events(self) -> list[ChainNote]:
        """The chains' changes since the last call; the caller owns the list."""
        pool = self._pool
        events = pool.events
        if not events:
            return []
        pool.events = []
        return events

    # ---- for the simulated HTTP server and tests ----------------------------------------

    def last_step_token_ids(self, result: StepResult) -> list[int]:
        """Every request that got a token in the last step, `result`: O(running), for a
        server that streams each token (the fleet simulator needs only `result`)."""
        ids = [rid for rid, r in self._running.items() if r.state is _DECODING]
        ids.extend(r.request_id for r in result.finished)
        return ids

    def check(self) -> None:
        """Assert the internal books balance (tests; O(running + cached segments))."""
        own = decoding = context = 0
        for request in self._running.values():
            if request.state is _DECODING:
                kv_tokens = self._step + 1 - request._base
                decoding += 1
                context += kv_tokens
            else:
                kv_tokens = request._computed
            own += -(-kv_tokens // self._bs) - request._group_held
        assert decoding == self._num_decoding, (decoding, self._num_decoding)
        assert context == self._decode_context, (context, self._decode_context)
        self._shared.check(
            r for r in self._running.values()
            if r.state is _DECODING and r._prefix_blocks and self._caching
        )  # fmt: skip
        assert sum(self._crossing) == decoding
        waiting = sum(1 for r in self._waiting if r.state is _WAITING)
        assert waiting == self._num_waiting, (waiting, self._num_waiting)
        assert len(self._running) <= self.config.max_num_seqs
        self._pool.check(own)
