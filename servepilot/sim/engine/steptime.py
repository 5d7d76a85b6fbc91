"""How long a scheduled step takes: `CostModel.step_time_s` as the scheduler runs it.

The scheduler asks once a step, ten million times in a fleet simulation, so the model's
coefficients are unpacked here once and the step's shape is passed as numbers, not built as
a `StepShape`. The expression and its order are `CostModel.step_time_s`'s and
`eager_launch_s`'s, so both agree to the last bit (tests/unit/test_gpu_profile.py).
"""

from __future__ import annotations

from servepilot.plan.costmodel import CostModel


class StepTime:
    """One replica's cost model, unpacked for the scheduler's step."""

    __slots__ = ("_coefficients", "_eager_floors", "_eager_host", "_graph_max_tokens", "_table")

    def __init__(self, cost: CostModel) -> None:
        self._coefficients = cost.coefficients
        self._table = cost.token_table_s
        self._eager_floors = (cost.eager_floor_s, cost.eager_mixed_floor_s)
        self._eager_host = (cost.eager_host_s, cost.eager_host_per_seq_s)
        self._graph_max_tokens = cost.graph_max_tokens

    def duration_s(
        self,
        prefill_tokens: int,
        prefill_seqs: int,
        decode_seqs: int,
        context: int,
        pairs: int,
        lead_s: float,
    ) -> float:
        """The step's time on the GPU from its start; its launch began `lead_s` before
        (async scheduling; negative: the host is busy until after the start)."""
        base, per_token, per_seq, per_decode, per_context, per_pair = self._coefficients
        duration = (
            base
            + per_token * prefill_tokens
            + per_seq * prefill_seqs
            + per_decode * decode_seqs
            + per_context * context
            + per_pair * pairs
        )
        tokens = prefill_tokens + decode_seqs
        if table := self._table:
            last = len(table) - 1
            duration += table[tokens] if tokens <= last else table[last] * tokens / last
        if tokens > self._graph_max_tokens:  # launched kernel by kernel as the GPU runs it
            host_s, per_seq_s = self._eager_host
            seqs = prefill_seqs + decode_seqs
            floor = self._eager_floors[decode_seqs > 0] + host_s + per_seq_s * seqs - lead_s
            if duration < floor:
                duration = floor
        elif lead_s < 0.0:
            duration -= lead_s  # a graph replays once it is launched
        return duration
