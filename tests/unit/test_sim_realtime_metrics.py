"""The simulated replica's queue-time and prefill-time histograms, vLLM's
request_queue_time_seconds and request_prefill_time_seconds: measured on the model's clock from
the first step that runs part of a request, chunked prefills included. The engine's clock is
held at 0, so the model's times are exact and the steps run back to back (each wait is real,
a few tens of milliseconds)."""

from __future__ import annotations

import asyncio

import pytest

from servepilot.engine.simserver.metrics import Histogram
from servepilot.engine.simserver.realtime import RealtimeEngine
from servepilot.plan.costmodel import CostModel
from servepilot.sim import ReplicaModel, SchedulerConfig

STEP_S = 0.01
COST = CostModel(base_s=STEP_S, per_prefill_token_s=0.0, per_prefill_seq_s=0.0,
                 per_decode_seq_s=0.0, per_context_token_s=0.0, per_prefill_pair_s=0.0,
                 source="test")  # fmt: skip


class Done:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def token(self, index: int) -> None:
        pass

    def finish(self) -> None:
        self.event.set()


async def _two_requests_one_slot() -> tuple[Histogram, Histogram]:
    # One sequence at a time, 64 tokens a step: the first prompt (150 tokens) is prefilled
    # over three steps and decoded in a fourth; the second waits for all four.
    config = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=2048,
                             block_size=16, num_blocks=1000)  # fmt: skip
    engine = RealtimeEngine(ReplicaModel(config, COST), clock=lambda: 0.0)
    engine.start()
    try:
        first, second = Done(), Done()
        engine.submit(list(range(150)), 2, first)
        engine.submit(list(range(1000, 1010)), 1, second)
        await asyncio.wait_for(asyncio.gather(first.event.wait(), second.event.wait()), 10)
        return engine.stats.queue, engine.stats.prefill
    finally:
        await engine.close()


def test_queue_and_prefill_times_start_at_the_first_step_that_runs_the_request() -> None:
    queue, prefill = asyncio.run(_two_requests_one_slot())
    assert queue.count == prefill.count == 2
    assert queue.total == pytest.approx(0 + 4 * STEP_S)  # the second waited four steps
    assert prefill.total == pytest.approx(3 * STEP_S + 1 * STEP_S)  # chunked: three steps
