"""What one engine step reports (compiled with the scheduler that builds it: accel.py)."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.plan.costmodel import StepShape
from servepilot.sim.engine.request import SimRequest


@dataclass(slots=True, init=False)
class StepResult:
    """What one engine step did.

    Not frozen on purpose: a frozen dataclass of this size costs 2.2 us to build against
    0.4 us, and a fleet simulation builds ten million of these. Treat it as read-only.

    Per-token timing without per-token records: every decoding request gets exactly one
    token per step (vLLM requires max_num_batched_tokens >= max_num_seqs), so each of this
    step's `decode_tokens` tokens came `itl_s` after the same request's previous token, and
    a request's tokens fall at the ends of consecutive steps from `first_token_s` to
    `finish_s` (TPOT = (finish_s - first_token_s) / (output_tokens - 1)). The only other
    gaps are those of requests resuming after a preemption, in `resumed_gaps_s`. Pooled ITL
    percentiles are a histogram of `itl_s` weighted by `decode_tokens`, plus the resumed
    gaps.
    """

    start_s: float
    duration_s: float
    prefill_tokens: int
    prefill_seqs: int
    decode_seqs: int
    context_tokens: int
    prefill_pairs: int
    tokens: int
    """Output tokens produced this step: first tokens, decode tokens and resumed tokens."""
    itl_s: float
    """End of this step minus end of the previous one: the gap of every decode token."""
    first_tokens: tuple[int, ...]
    """Requests whose first token came at the end of this step."""
    finished: tuple[SimRequest, ...]
    """Requests that produced their last token this step, times filled in."""
    preempted: tuple[int, ...]
    resumed_gaps_s: tuple[float, ...]
    """For requests recomputed after a preemption: the gap before their next token."""

    def __init__(
        self,
        start_s: float,
        duration_s: float,
        prefill_tokens: int,
        prefill_seqs: int,
        decode_seqs: int,
        context_tokens: int,
        prefill_pairs: int,
        tokens: int,
        itl_s: float,
        first_tokens: tuple[int, ...],
        finished: tuple[SimRequest, ...],
        preempted: tuple[int, ...],
        resumed_gaps_s: tuple[float, ...],
    ) -> None:
        # The dataclass's __init__, written out so that the compiled build's is native.
        self.start_s = start_s
        self.duration_s = duration_s
        self.prefill_tokens = prefill_tokens
        self.prefill_seqs = prefill_seqs
        self.decode_seqs = decode_seqs
        self.context_tokens = context_tokens
        self.prefill_pairs = prefill_pairs
        self.tokens = tokens
        self.itl_s = itl_s
        self.first_tokens = first_tokens
        self.finished = finished
        self.preempted = preempted
        self.resumed_gaps_s = resumed_gaps_s

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def decode_tokens(self) -> int:
        """Tokens whose previous token came at the end of the previous step."""
        return self.decode_seqs

    @property
    def shape(self) -> StepShape:
        return StepShape(
            self.prefill_tokens,
            self.prefill_seqs,
            self.decode_seqs,
            self.context_tokens,
            self.prefill_pairs,
        )
