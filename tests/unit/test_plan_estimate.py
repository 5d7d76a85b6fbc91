"""The planner's throughput and latency estimates (servepilot/plan/estimate.py): exact where
the cost model makes them exact, and close to the replica simulator where they are a
steady-state approximation."""

from __future__ import annotations

import random
import statistics

import pytest

from servepilot.core.config import TrafficConfig
from servepilot.core.slo import Slo
from servepilot.plan.costmodel import CostModel, StepShape, prefill_pairs
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.estimate import Limit, ReplicaLoad, estimate
from servepilot.plan.hardware import get_accelerator
from servepilot.plan.planner import make_plan
from servepilot.plan.presets import load_preset
from servepilot.plan.request import PlanRequest
from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest

GPU_LIKE = CostModel(5e-3, 1.5e-5, 5e-5, 2e-5, 2.5e-8, 1e-10, "test: gpu-like")
CPU_LIKE = CostModel(0.12, 4.1e-3, 0.0, 5.6e-3, 13.4e-6, 3.4e-6, "test: cpu-like")


def _load(prompt: int, output: int, seqs: int = 64, budget: int = 2048) -> ReplicaLoad:
    return ReplicaLoad(prompt, output, seqs, budget, kv_capacity_tokens=10**7)


def test_one_request_alone_is_its_prefill_then_one_decode_step_per_token() -> None:
    found = estimate(GPU_LIKE, _load(300, 50), replicas=1, target_qps=None)
    prefill_s = GPU_LIKE.step_time_s(StepShape(300, 1, 0, 0, prefill_pairs(300, 0)))
    decode_s = GPU_LIKE.step_time_s(StepShape(0, 0, 1, 300 + 25, 0))
    assert found.idle.ttft_ms == pytest.approx(prefill_s * 1e3)
    assert found.idle.tpot_ms == pytest.approx(decode_s * 1e3)
    assert found.idle.requests_per_s == pytest.approx(1 / (prefill_s + 49 * decode_s))


def test_a_long_prompt_alone_is_prefilled_in_budget_sized_chunks() -> None:
    found = estimate(CPU_LIKE, _load(5000, 10, budget=2048), replicas=1, target_qps=None)
    chunks = ((2048, 0), (2048, 2048), (904, 4096))
    want = sum(CPU_LIKE.step_time_s(StepShape(c, 1, 0, k, prefill_pairs(c, k))) for c, k in chunks)
    assert found.idle.ttft_ms == pytest.approx(want * 1e3)


def test_with_only_a_per_step_cost_capacity_is_the_batch_per_step() -> None:
    flat = CostModel(0.01, 0, 0, 0, 0, 0, "test: flat")
    found = estimate(flat, _load(100, 20, seqs=64), replicas=3, target_qps=1000)
    # 64 requests in flight, each step yields one token for each: 6,400 tokens/s.
    assert found.capacity.output_tokens_per_s == pytest.approx(6400)
    assert found.capacity.requests_per_s == pytest.approx(320)
    assert found.fleet_requests_per_s == pytest.approx(960)
    assert found.replicas_for_target == 4  # 1,000 / 320 rounded up
    assert found.limit is Limit.MAX_NUM_SEQS


def test_the_smallest_of_seqs_kv_and_budget_bounds_capacity() -> None:
    kv = ReplicaLoad(100, 100, max_num_seqs=256, max_num_batched_tokens=8192,
                     kv_capacity_tokens=20_000)  # fmt: skip
    found = estimate(GPU_LIKE, kv, replicas=1, target_qps=None)
    assert found.limit is Limit.KV_CACHE and found.capacity.concurrency == pytest.approx(100)
    # 256 running, 32-token outputs: 8 finish per step, needing 8 x 2,000 prompt tokens of a
    # 4,096 budget: the budget admits 4,096 / (2,000 + 31) per step.
    budget = ReplicaLoad(2000, 32, max_num_seqs=256, max_num_batched_tokens=4096,
                         kv_capacity_tokens=10**7)  # fmt: skip
    found = estimate(GPU_LIKE, budget, replicas=1, target_qps=None)
    assert found.limit is Limit.TOKEN_BUDGET
    assert found.capacity.concurrency == pytest.approx(4096 / 2031 * 32)


def _closed_loop(cost: CostModel, load: ReplicaLoad, running: int) -> tuple[float, float, float]:
    """TTFT p50 (ms), TPOT p50 (ms) and output tokens/s of the replica simulator with
    `running` requests always in flight, lengths uniform within +-50% of the means."""
    rng = random.Random(7)
    config = SchedulerConfig(
        max_num_seqs=load.max_num_seqs, max_num_batched_tokens=load.max_num_batched_tokens,
        max_model_len=8192, block_size=16, num_blocks=load.kv_capacity_tokens // 16,
    )  # fmt: skip
    model = ReplicaModel(config, cost)
    ids = iter(range(10**9))

    def add(now_s: float) -> None:
        prompt = round(load.input_tokens * rng.uniform(0.5, 1.5))
        output = max(2, round(load.output_tokens * rng.uniform(0.5, 1.5)))
        model.add(SimRequest(next(ids), prompt, output, now_s))

    for _ in range(running):
        add(0.0)
    done: list[SimRequest] = []
    now_s = 0.0
    while len(done) < 3000:
        result = model.step(now_s)
        assert result is not None
        now_s = result.end_s
        for request in result.finished:
            done.append(request)
            add(now_s)
    steady = done[len(done) // 5 :]
    tokens = sum(r.output_tokens for r in steady[1:])
    span_s = (steady[-1].finish_s or 0.0) - (steady[0].finish_s or 0.0)
    return (
        statistics.median(r.ttft_s or 0.0 for r in steady) * 1e3,
        statistics.median(r.tpot_s or 0.0 for r in steady) * 1e3,
        tokens / span_s,
    )


@pytest.mark.parametrize(
    ("prompt", "output", "seqs", "budget"),
    [(200, 48, 8, 2048), (512, 128, 64, 2048), (512, 128, 256, 8192), (1000, 100, 128, 2048)],
)
def test_capacity_agrees_with_the_replica_simulator(
    prompt: int, output: int, seqs: int, budget: int
) -> None:
    load = _load(prompt, output, seqs, budget)
    found = estimate(GPU_LIKE, load, replicas=1, target_qps=None).capacity
    ttft_ms, tpot_ms, tokens_per_s = _closed_loop(GPU_LIKE, load, round(found.concurrency))
    assert found.output_tokens_per_s == pytest.approx(tokens_per_s, rel=0.03)
    assert found.tpot_ms == pytest.approx(tpot_ms, rel=0.03)
    assert found.ttft_ms == pytest.approx(ttft_ms, rel=0.15)


def _request(**changes: object) -> PlanRequest:
    base = PlanRequest(
        model=load_preset("llama-3.1-8b"),
        model_ref="llama-3.1-8b",
        accelerator=get_accelerator("h100"),
        count=1,
        nodes=1,
        weights_dtype=WeightDtype.BF16,
        kv_dtype=KvDtype.AUTO,
        traffic=TrafficConfig(input_tokens=512, output_tokens=128, target_qps=100),
        slo=Slo(),
    )
    return base.replace(**changes)


def test_a_plan_that_fits_carries_estimates_from_the_roofline_or_a_profile() -> None:
    plan = make_plan(_request())
    assert plan.estimates is not None
    assert plan.estimates.source == "roofline: h100-80/llama-3.1-8b"
    assert plan.estimates.replicas_for_target is not None
    assert plan.estimates.replicas_for_target == -(-100 // plan.estimates.capacity.requests_per_s)
    measured = make_plan(_request(cost_model=GPU_LIKE))
    assert measured.estimates is not None and measured.estimates.source == "test: gpu-like"


def test_a_plan_that_does_not_fit_has_no_estimates() -> None:
    plan = make_plan(_request(model=load_preset("llama-3.1-70b"), model_ref="llama-3.1-70b"))
    assert not plan.fits
    assert plan.estimates is None
