"""The replica simulator's configuration and what one step reports."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import StepShape
from servepilot.sim.request import SimRequest


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The engine flags that shape scheduling (vLLM's names)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    """vLLM's num_gpu_blocks, the null block included (KvCacheShape.num_blocks)."""
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    async_scheduling: bool = False
    """vLLM's default on GPUs (vLLM-CPU forces it off): the next step is scheduled before
    the last one's output is processed, so a finished request keeps its slot and its blocks
    through one more scheduling."""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        batched = self.max_num_batched_tokens
        if batched < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({batched}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), as vLLM requires"
            )
        if not self.enable_chunked_prefill and batched < self.max_model_len:
            raise ConfigError(
                f"without chunked prefill, max_num_batched_tokens ({batched}) must be >= "
                f"max_model_len ({self.max_model_len}), as vLLM requires"
            )
        blocks = -(-self.max_model_len // self.block_size)
        if self.num_blocks < blocks + 1:
            raise ConfigError(
                f"num_blocks ({self.num_blocks}) cannot hold one request of max_model_len "
                f"({self.max_model_len} tokens = {blocks} blocks, plus vLLM's null block)"
            )


@dataclass(slots=True)
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
