"""The replica simulator's configuration, and what one step reports (`StepResult`, in steps.py)."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.sim.engine.steps import StepResult

__all__ = ["SchedulerConfig", "StepResult"]


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
