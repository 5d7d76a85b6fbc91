"""The simulated vLLM engine (servepilot/sim/engine): one request's steps, and the scheduler's
rules (max_num_seqs, FCFS, running before waiting, chunked prefill, async scheduling, the
whole prompt's blocks), with answers known in advance. Prefix caching and preemption:
test_sim_replica_kv.py; the API's edges: test_sim_replica_api.py; vLLM's own scheduler side
by side: test_sim_replica_vllm.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from servepilot.plan.costmodel import StepShape
from servepilot.sim import ReplicaModel, RequestState, SimRequest
from tests.unit.sim_replica_support import COST, run_to_idle, scheduler_config

# ---- one request ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "output", "budget"),
    [(100, 5, 64), (64, 1, 64), (1, 3, 16), (1000, 10, 256), (513, 40, 512), (17, 2, 16)],
)
def test_one_request_prefills_in_chunks_then_decodes(prompt: int, output: int, budget: int) -> None:
    model = ReplicaModel(
        scheduler_config(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=2048), COST
    )
    request = SimRequest(7, prompt, output, arrival_s=0.0)
    model.add(request)
    results = run_to_idle(model)
    prefill_steps = math.ceil(prompt / budget)
    assert len(results) == prefill_steps + output - 1
    chunks = [r.prefill_tokens for r in results[:prefill_steps]]
    assert chunks == [budget] * (prefill_steps - 1) + [prompt - budget * (prefill_steps - 1)]
    # vLLM: the first token comes with the last prefill chunk.
    assert [r.first_tokens for r in results] == [()] * (prefill_steps - 1) + [(7,)] + [()] * (
        output - 1
    )
    assert request.first_token_s == results[prefill_steps - 1].end_s
    assert request.first_token_step == prefill_steps
    for index, result in enumerate(results[prefill_steps:]):
        assert result.shape == StepShape(0, 0, 1, prompt + index, 0)
    assert [r.request_id for r in results[-1].finished] == [7]
    assert request.state is RequestState.FINISHED
    assert request.finish_s == results[-1].end_s
    assert request.ttft_s == request.first_token_s and request.e2e_s == request.finish_s
    if output > 1:
        decode_s = sum(r.duration_s for r in results[prefill_steps:])
        assert request.tpot_s == pytest.approx(decode_s / (output - 1))
    else:
        assert request.tpot_s is None
    assert sum(r.tokens for r in results) == output
    assert model.idle and model.step(99.0) is None


def test_step_time_is_the_cost_models_for_the_reported_shape() -> None:
    model = ReplicaModel(scheduler_config(), COST)
    for i in range(6):
        model.add(SimRequest(i, 40 + 13 * i, 5 + i, 0.0))
    now = 3.0
    for result in run_to_idle(model, now):
        assert result.duration_s == COST.step_time_s(result.shape)
        assert result.start_s == now
        now = result.end_s


def test_decode_tokens_come_one_step_apart() -> None:
    # TPOT and ITL from the step ends alone: a decoding request's tokens are the ends of
    # consecutive steps, and each decode token's gap is its step's itl_s.
    model = ReplicaModel(scheduler_config(max_num_batched_tokens=128), COST)
    requests = [SimRequest(i, 50 * (i + 1), 6, 0.0) for i in range(3)]
    for request in requests:
        model.add(request)
    results = run_to_idle(model)
    ends = [r.end_s for r in results]
    for request in requests:
        assert request.first_token_s is not None and request.finish_s is not None
        tokens_at = ends[request.first_token_step - 1 : request.finish_step]
        assert len(tokens_at) == request.output_tokens
        assert tokens_at[-1] == request.finish_s
    for previous, result in itertools.pairwise(results):
        if result.decode_tokens:
            assert result.itl_s == pytest.approx(result.end_s - previous.end_s)


# ---- the scheduler's rules -------------------------------------------------------------


def test_max_num_seqs_caps_the_running_set() -> None:
    model = ReplicaModel(scheduler_config(max_num_seqs=3, max_num_batched_tokens=512), COST)
    for i in range(7):
        model.add(SimRequest(i, 10, 4 + i, 0.0))
    first = model.step(0.0)
    assert first is not None and first.first_tokens == (0, 1, 2)
    assert model.num_running == 3 and model.num_waiting == 4
    results = [first, *run_to_idle(model, first.end_s)]
    assert max(r.prefill_seqs + r.decode_seqs for r in results) == 3
    # Request 3 starts in the step after request 0 (the shortest) finished.
    finished_0 = next(i for i, r in enumerate(results) if 0 in [q.request_id for q in r.finished])
    assert 3 in results[finished_0 + 1].first_tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_async_scheduling_frees_a_finished_slot_one_step_later(async_scheduling: bool) -> None:
    model = ReplicaModel(scheduler_config(max_num_seqs=2, async_scheduling=async_scheduling), COST)
    model.add(SimRequest(0, 10, 20, 0.0))
    model.add(SimRequest(1, 10, 3, 0.0))
    model.add(SimRequest(2, 10, 3, 0.0))
    results = run_to_idle(model)
    # Request 1: a prefill step and two decode steps. vLLM pipelines the next step's
    # scheduling before the last output is processed, so request 2 waits one more step
    # (while request 0 keeps the engine busy).
    assert [r.request_id for r in results[2].finished] == [1]
    started = next(i for i, r in enumerate(results) if r.first_tokens == (2,))
    assert started == (4 if async_scheduling else 3)
    assert model.num_running == 0 and model.idle


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_async_scheduling_costs_no_time_when_only_finished_requests_remain(
    async_scheduling: bool,
) -> None:
    # vLLM's empty step (nothing to run but finished requests to drain) takes no time.
    model = ReplicaModel(scheduler_config(max_num_seqs=1, async_scheduling=async_scheduling), COST)
    model.add(SimRequest(0, 10, 3, 0.0))
    model.add(SimRequest(1, 10, 3, 0.0))
    results = run_to_idle(model)
    assert [r.first_tokens for r in results] == [(0,), (), (), (1,), (), ()]


def test_waiting_requests_start_first_come_first_served() -> None:
    model = ReplicaModel(scheduler_config(max_num_seqs=2, max_num_batched_tokens=256), COST)
    for i in range(6):
        model.add(SimRequest(i, 30, 3, float(i)))
    order = [rid for result in run_to_idle(model) for rid in result.first_tokens]
    assert order == list(range(6))


def test_running_requests_are_scheduled_before_waiting_ones() -> None:
    model = ReplicaModel(scheduler_config(max_num_batched_tokens=64), COST)
    model.add(SimRequest(0, 100, 5, 0.0))
    model.step(0.0)  # 64 of request 0's 100 prompt tokens
    model.add(SimRequest(1, 100, 5, 0.0))
    result = model.step(1.0)
    # Request 0's remaining 36 first, then request 1 gets what is left of the budget.
    assert result is not None and result.prefill_tokens == 64 and result.prefill_seqs == 2
    assert result.first_tokens == (0,)
    assert result.context_tokens == 64


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    chunked = ReplicaModel(scheduler_config(max_num_batched_tokens=512), COST)
    whole = ReplicaModel(
        scheduler_config(max_num_batched_tokens=512, enable_chunked_prefill=False), COST
    )
    for model in (chunked, whole):
        model.add(SimRequest(0, 300, 3, 0.0))
        model.add(SimRequest(1, 300, 3, 0.0))
        model.add(SimRequest(2, 100, 3, 0.0))
    step_chunked, step_whole = chunked.step(0.0), whole.step(0.0)
    assert step_chunked is not None and step_whole is not None
    assert (step_chunked.prefill_tokens, step_chunked.prefill_seqs) == (512, 2)
    # Request 1 does not fit the 212 tokens left, and FCFS stops there (request 2 waits too).
    assert (step_whole.prefill_tokens, step_whole.prefill_seqs) == (300, 1)
    step_whole = whole.step(step_whole.end_s)
    assert step_whole is not None and step_whole.first_tokens == (1, 2)


def test_the_whole_prompt_must_fit_in_free_blocks_to_be_admitted() -> None:
    # 20 usable blocks: request 0 holds 13 (200 tokens); request 1 needs 13 for its whole
    # prompt although its first 64-token chunk would need 4 (scheduler_reserve_full_isl).
    model = ReplicaModel(scheduler_config(num_blocks=21, max_model_len=320), COST)
    model.add(SimRequest(0, 200, 60, 0.0))
    model.add(SimRequest(1, 200, 5, 0.0))
    results = run_to_idle(model)
    first_token_steps = [i for i, r in enumerate(results) if r.first_tokens]
    assert [results[i].first_tokens for i in first_token_steps] == [(0,), (1,)]
    assert all(r.prefill_seqs + r.decode_seqs <= 1 for r in results)
    assert model.num_preemptions == 0


@pytest.mark.parametrize(("prompt", "lead_s", "expected_s"), [
    (1000, 0.0, 0.2),    # eager from idle: the host's whole launch
    (1000, 0.05, 0.15),  # its launch began 50 ms before: that much of it is behind
    (1000, 0.15, None),  # ... and the rest is under the GPU's own time: the composed step
    (100, -0.03, None),  # a graph replays once launched: 30 ms late, plus its own time
])  # fmt: skip
def test_a_step_launched_ahead_or_late_takes_what_is_left(
    prompt: int, lead_s: float, expected_s: float | None
) -> None:
    cost = replace(COST, eager_floor_s=0.2, graph_max_tokens=512)
    config = scheduler_config(max_model_len=2048, max_num_batched_tokens=2048)
    plain = ReplicaModel(config, replace(cost, eager_floor_s=0.0))
    plain.add(SimRequest(0, prompt, 2, 0.0))
    own = plain.step(1.0)
    assert own is not None and own.duration_s < 0.12  # the composed step, without a floor
    model = ReplicaModel(config, cost)
    model.add(SimRequest(0, prompt, 2, 0.0))
    result = model.step(1.0, lead_s)
    assert result is not None
    if expected_s is None:
        expected_s = own.duration_s - min(lead_s, 0.0)
    assert result.duration_s == pytest.approx(expected_s, abs=1e-12)
