"""The simulated replica's engine loop with async scheduling: a request that reaches a busy
engine joins the step after next (vLLM plans step k+1 when step k starts), one that reaches
an idle engine the next step. Ordered by steps, not timed: the steps last 0.3 s and the second
request arrives 0.05 s into the first."""

from __future__ import annotations

import asyncio

import pytest

from servepilot.engine.simserver.realtime import RealtimeEngine
from servepilot.plan.costmodel import CostModel
from servepilot.sim import ReplicaModel, SchedulerConfig

COST = CostModel(base_s=0.3, per_prefill_token_s=0.0, per_prefill_seq_s=0.0,
                 per_decode_seq_s=0.0, per_context_token_s=0.0, per_prefill_pair_s=0.0,
                 source="test")  # fmt: skip


class StepOfFirstToken:
    """Records the engine's step count when the first token arrives."""

    def __init__(self, engine: RealtimeEngine) -> None:
        self.engine = engine
        self.step: int | None = None
        self.done = asyncio.Event()

    def token(self, index: int) -> None:
        if index == 0:
            self.step = self.engine.model.steps

    def finish(self) -> None:
        self.done.set()


async def _second_request_first_token_step(async_scheduling: bool) -> tuple[int, int]:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048,
                             block_size=16, num_blocks=1000,
                             async_scheduling=async_scheduling)  # fmt: skip
    engine = RealtimeEngine(ReplicaModel(config, COST))
    engine.start()
    try:
        first, second = StepOfFirstToken(engine), StepOfFirstToken(engine)
        engine.submit(list(range(100)), 4, first)
        await asyncio.sleep(0.05)  # inside the first step (0.3 s)
        engine.submit(list(range(200, 300)), 1, second)
        await asyncio.wait_for(asyncio.gather(first.done.wait(), second.done.wait()), 10)
        assert first.step is not None and second.step is not None
        return first.step, second.step
    finally:
        await engine.close()


@pytest.mark.parametrize(("async_scheduling", "expected"), [(False, 2), (True, 3)])
def test_a_request_reaching_a_busy_engine_waits_one_more_step_when_async(
    async_scheduling: bool, expected: int
) -> None:
    first_step, second_step = asyncio.run(_second_request_first_token_step(async_scheduling))
    assert first_step == 1  # an idle engine takes a request at once
    assert second_step == expected
