"""The simulated replica's engine loop with async scheduling: a request that reaches a busy
engine joins the step after next (vLLM plans step k+1 when step k starts), one that reaches
an idle engine the next step. Ordered by steps, not timed: the steps last 0.3 s and the second
request arrives 0.05 s into the first."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from servepilot.engine.simserver.realtime import RealtimeEngine
from servepilot.plan.costmodel import CostModel
from servepilot.sim import ReplicaModel, SchedulerConfig

COST = CostModel(base_s=0.3, per_prefill_token_s=0.0, per_prefill_seq_s=0.0,
                 per_decode_seq_s=0.0, per_context_token_s=0.0, per_prefill_pair_s=0.0,
                 source="test")  # fmt: skip


class StepOfFirstToken:
    """Records the step that produced the first token: the engine hands a step's tokens out
    once it has planned the next one (vLLM launches that first), so while the first request
    still decodes, the count is one past it."""

    def __init__(self, engine: RealtimeEngine) -> None:
        self.engine = engine
        self.step: int | None = None
        self.done = asyncio.Event()

    def token(self, index: int) -> None:
        if index == 0:
            self.step = self.engine.model.steps - 1

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


class TokenTimes:
    """Records when each token reached the sink, on the engine's clock."""

    def __init__(self, engine: RealtimeEngine) -> None:
        self.engine = engine
        self.at: list[float] = []
        self.done = asyncio.Event()

    def token(self, index: int) -> None:
        self.at.append(self.engine.now())

    def finish(self) -> None:
        self.done.set()


async def _held_back_token_times() -> tuple[list[float], list[float]]:
    """A decodes in 0.1 s graph steps; B (1,000 prompt tokens) arrives during A's prefill
    and joins step 3, too large for a graph: launched in 0.4 s from the moment step 1's
    token is out."""
    cost = replace(COST, base_s=0.1, eager_floor_s=0.4, eager_mixed_floor_s=0.4,
                   graph_max_tokens=512)  # fmt: skip
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048,
                             block_size=16, num_blocks=1000, async_scheduling=True)  # fmt: skip
    engine = RealtimeEngine(ReplicaModel(config, cost))
    engine.start()
    try:
        a, b = TokenTimes(engine), TokenTimes(engine)
        engine.submit(list(range(100)), 4, a)
        await asyncio.sleep(0.03)  # inside step 1
        engine.submit(list(range(200, 1200)), 1, b)
        await asyncio.wait_for(asyncio.gather(a.done.wait(), b.done.wait()), 10)
        return a.at, b.at
    finally:
        await engine.close()


def test_an_eager_launch_holds_back_the_tokens_of_the_step_before() -> None:
    a, b = asyncio.run(_held_back_token_times())
    start = a[0] - 0.1  # step 1 began when A arrived
    # A: step 1's token at 0.1 s; step 2's (0.1-0.2 s) waits for step 3's launch (0.1-0.5
    # s), and step 3's own comes with it; then steps 4 at 0.6 s.
    expected = [0.1, 0.5, 0.5, 0.6]
    assert [t - start for t in a] == pytest.approx(expected, abs=0.04)
    assert b[0] - start == pytest.approx(0.5, abs=0.04)  # B's token: step 3's
