"""What the simulated engine's tests share: a cost model in round numbers, a small replica's
scheduler config, and a driver that steps a replica until it idles, checking its books."""

from __future__ import annotations

from typing import Any

from servepilot.plan.costmodel import CostModel
from servepilot.sim import ReplicaModel, SchedulerConfig, StepResult

COST = CostModel(
    base_s=0.01,
    per_prefill_token_s=1e-4,
    per_prefill_seq_s=1e-3,
    per_decode_seq_s=2e-3,
    per_context_token_s=1e-6,
    per_prefill_pair_s=0.0,
    source="test",
)


def scheduler_config(**changes: Any) -> SchedulerConfig:
    fields: dict[str, Any] = dict(
        max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512, block_size=16
    )
    fields["num_blocks"] = 400
    return SchedulerConfig(**(fields | changes))


def run_to_idle(model: ReplicaModel, now: float = 0.0) -> list[StepResult]:
    """Step until idle, checking the books after every step."""
    results = []
    while (result := model.step(now)) is not None:
        model.check()
        results.append(result)
        now = result.end_s
    return results
