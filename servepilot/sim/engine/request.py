"""A request as the replica simulator sees it: token counts, a shared prefix, its progress."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from servepilot.sim.engine.kvblocks import Segment


class RequestState(enum.Enum):
    WAITING = "waiting"
    """In the waiting queue: new, or preempted and to be recomputed."""
    PREFILLING = "prefilling"
    """Running, its prompt (or, after a preemption, prompt plus output) not all computed."""
    DECODING = "decoding"
    """Running, producing one token per step."""
    FINISHED = "finished"
    ABORTED = "aborted"


_WAITING: Final = RequestState.WAITING


@dataclass(slots=True, init=False)
class SimRequest:
    """One request. The caller fills the first seven fields; `ReplicaModel` keeps the rest.

    Prefix caching without token ids: requests with the same `prefix_group` share their first
    `prefix_tokens` tokens (a system prompt, an earlier turn of a conversation). The KV
    blocks lying wholly inside that prefix are the group's; every other block is the
    request's own."""

    request_id: int
    prompt_tokens: int
    output_tokens: int
    """Tokens it generates (as with ignore_eos and max_tokens)."""
    arrival_s: float
    prefix_group: int | None = None
    prefix_tokens: int = 0
    priority: int = 1
    """Carried for the gateway's admission and routing; the FCFS engine ignores it (as vLLM
    does unless started with --scheduling-policy priority)."""

    # ---- progress, kept by ReplicaModel (read them, do not write them) ----
    state: RequestState = field(default=RequestState.WAITING, init=False)
    scheduled_s: float | None = field(default=None, init=False)
    """Start of the first step that ran part of it: vLLM's queue time ends there and its
    prefill time begins (request_queue_time_seconds, request_prefill_time_seconds)."""
    first_token_s: float | None = field(default=None, init=False)
    """End of the step that produced its first token."""
    finish_s: float | None = field(default=None, init=False)
    """End of the step that produced its last token."""
    first_token_step: int = field(default=-1, init=False)
    finish_step: int = field(default=-1, init=False)
    num_preemptions: int = field(default=0, init=False)

    # ---- internals of ReplicaModel and BlockPool ----
    _num_tokens: int = field(default=0, init=False, repr=False)
    """Tokens its (re)computation covers: the prompt, plus the output so far once preempted."""
    _computed: int = field(default=0, init=False, repr=False)
    """Tokens in the KV cache while prefilling (and, once finished under async scheduling,
    until its blocks are released)."""
    _chunk: int = field(default=0, init=False, repr=False)
    """Tokens scheduled in the current step, while prefilling."""
    _base: int = field(default=0, init=False, repr=False)
    """While decoding: its tokens in KV at the start of step s are `s - _base`."""
    _finish_at: int = field(default=-1, init=False, repr=False)
    _prefix_blocks: int = field(default=0, init=False, repr=False)
    """Blocks wholly inside the shared prefix (0 without a group)."""
    _group_held: int = field(default=0, init=False, repr=False)
    """Of its blocks, how many are the group's (counted once for the whole group)."""
    _own_segment: Segment | None = field(default=None, init=False, repr=False)
    """After a preemption: its own cached blocks, which its recomputation can hit."""
    _last_token_s: float = field(default=0.0, init=False, repr=False)
    """When preempted while decoding: the time of its last token, for the resumed gap."""

    def __init__(
        self,
        request_id: int,
        prompt_tokens: int,
        output_tokens: int,
        arrival_s: float,
        prefix_group: int | None = None,
        prefix_tokens: int = 0,
        priority: int = 1,
    ) -> None:
        # The dataclass's __init__, written out: compiled (accel.py), this one is native,
        # while a generated one stays interpreted (a fleet run builds millions of requests).
        # tests/unit/test_sim_speedups.py checks it against the fields' defaults.
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.arrival_s = arrival_s
        self.prefix_group = prefix_group
        self.prefix_tokens = prefix_tokens
        self.priority = priority
        self.state = _WAITING
        self.scheduled_s = None
        self.first_token_s = None
        self.finish_s = None
        self.first_token_step = -1
        self.finish_step = -1
        self.num_preemptions = 0
        self._num_tokens = 0
        self._computed = 0
        self._chunk = 0
        self._base = 0
        self._finish_at = -1
        self._prefix_blocks = 0
        self._group_held = 0
        self._own_segment = None
        self._last_token_s = 0.0

    # ---- the bench schema's per-request metrics (DESIGN.md), in seconds ----

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1); None for a single output token."""
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)
