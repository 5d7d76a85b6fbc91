"""A replica's prefill and decode times from its cost model: what predicted_latency routes on.

`StepLatency` is routing's `StepTimeModel` (routing/predicted.py; matched by shape, so plan
need not import routing): the gateway under `up` and the fleet simulator build it from the
same cost model the simulator steps with (a calibrated profile or the roofline) and the
replica's `max_num_batched_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.plan.costmodel import CostModel, StepShape, prefill_pairs


@dataclass(frozen=True, slots=True)
class StepLatency:
    cost: CostModel
    max_num_batched_tokens: int
    """The engine's token budget per step: a long prefill takes several steps."""

    def prefill_s(
        self, new_tokens: int, cached_tokens: int, decode_seqs: int, context_tokens: int
    ) -> float:
        """The steps that prefill `new_tokens` after `cached_tokens`, in chunks of what the
        step budget leaves beside `decode_seqs` decoding sequences (one token each).

        The cost model's linear terms add up over the chunks in closed form (its measured
        token operators, where it has them, are looked up per step):
        each step pays the base, one prefill sequence and the decode batch; the chunks
        together compute every new token and the whole prompt's attention pairs (the sum of
        the chunks' pairs is the unchunked prompt's); the k-th chunk also reads the k
        chunks before it from KV."""
        new = max(1, new_tokens)
        chunk = max(1, self.max_num_batched_tokens - decode_seqs)
        steps = -(-new // chunk)
        shape = StepShape(
            prefill_tokens=new,
            prefill_seqs=steps,
            decode_seqs=decode_seqs * steps,
            context_tokens=steps * (context_tokens + cached_tokens)
            + chunk * steps * (steps - 1) // 2,
            prefill_pairs=prefill_pairs(new, cached_tokens),
        )
        total = self.cost.step_time_s(shape) + (steps - 1) * self.cost.base_s
        if self.cost.token_table_s:
            # The measured token operators are not linear: each step's tokens look it up.
            last = new - chunk * (steps - 1)
            per_step = (steps - 1) * self.cost.token_ops_s(chunk + decode_seqs)
            per_step += self.cost.token_ops_s(last + decode_seqs)
            total += per_step - self.cost.token_ops_s(new + decode_seqs * steps)
        return total

    def decode_step_s(self, decode_seqs: int, context_tokens: int) -> float:
        return self.cost.step_time_s(StepShape(0, 0, decode_seqs, context_tokens, 0))
