"""The simulated engine's KV blocks: prefix caching (hits, shared blocks, LRU eviction) and
preemption when the blocks run out, and random workloads that must finish every request
exactly once whatever the cache and the preemptions do.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from servepilot.plan.costmodel import StepShape, prefill_pairs
from servepilot.sim import ReplicaModel, RequestState, SimRequest
from tests.unit.sim_replica_support import COST, run_to_idle, scheduler_config

# ---- prefix caching --------------------------------------------------------------------


def test_second_request_of_a_group_skips_the_cached_prefix() -> None:
    model = ReplicaModel(scheduler_config(max_num_batched_tokens=512), COST)
    model.add(SimRequest(0, 150, 3, 0.0, prefix_group=9, prefix_tokens=100))
    run_to_idle(model)
    model.add(SimRequest(1, 130, 3, 1.0, prefix_group=9, prefix_tokens=100))
    result = model.step(1.0)
    # 100 shared tokens fill 6 blocks of 16: 96 tokens hit, 34 are computed.
    assert result is not None and result.shape == StepShape(34, 1, 0, 96, prefill_pairs(34, 96))
    assert model.prefix_cache_queries == 150 + 130
    assert model.prefix_cache_hits == 96
    assert model.prefix_hit_rate == pytest.approx(96 / 280)


def test_concurrent_requests_of_a_group_share_blocks() -> None:
    model = ReplicaModel(scheduler_config(max_num_batched_tokens=512), COST)
    for i in range(3):
        model.add(SimRequest(i, 120, 20, 0.0, prefix_group=1, prefix_tokens=100))
    result = model.step(0.0)
    # vLLM caches a block when it is scheduled: requests later in the same step hit it.
    assert result is not None and result.shape == StepShape(
        120 + 24 + 24, 3, 0, 96 * 2, prefill_pairs(120, 0) + 2 * prefill_pairs(24, 96)
    )
    shared_once = 6 + 3 * 2  # the group's 6 blocks once, then 2 own blocks each (24 + 1)
    assert model.kv_usage == pytest.approx(shared_once / 399)


@pytest.mark.parametrize("caching", [True, False])
def test_a_decode_step_reads_the_prefix_its_decoders_share_once(caching: bool) -> None:
    # Decode attention reads a KV block the batch shares once from memory: the step's context
    # counts the group's 6 blocks (96 tokens) once, not once per decoder. Without prefix
    # caching each request holds its own copy, read in full.
    model = ReplicaModel(
        scheduler_config(max_num_batched_tokens=512, enable_prefix_caching=caching), COST
    )
    for i in range(3):
        model.add(SimRequest(i, 120, 20, 0.0, prefix_group=1, prefix_tokens=100))
    first = model.step(0.0)
    assert first is not None
    decode = model.step(first.end_s)
    shared = 2 * 96 if caching else 0
    assert decode is not None and decode.shape == StepShape(0, 0, 3, 3 * 120 - shared, 0)
    model.check()
    model.abort(0)  # one reader fewer: the other two still share the group's blocks
    after = model.step(decode.end_s)
    shared = 96 if caching else 0
    assert after is not None and after.shape == StepShape(0, 0, 2, 2 * 121 - shared, 0)
    model.check()
    run_to_idle(model, after.end_s)


def test_a_prompt_all_prefix_still_computes_its_last_token() -> None:
    model = ReplicaModel(scheduler_config(), COST)
    model.add(SimRequest(0, 64, 2, 0.0, prefix_group=1, prefix_tokens=64))
    run_to_idle(model)
    model.add(SimRequest(1, 64, 2, 0.0, prefix_group=1, prefix_tokens=64))
    result = model.step(10.0)
    # 4 full blocks cached, but the last token must be computed: 3 blocks hit.
    assert result is not None and result.shape == StepShape(16, 1, 0, 48, prefill_pairs(16, 48))


def test_cached_prefix_is_evicted_least_recently_used_first() -> None:
    # 30 usable blocks; group 1's 6 blocks go to the free queue when request 0 finishes,
    # then unique requests fill the pool and evict them.
    model = ReplicaModel(
        scheduler_config(num_blocks=31, max_num_batched_tokens=512, max_model_len=320), COST
    )
    model.add(SimRequest(0, 100, 2, 0.0, prefix_group=1, prefix_tokens=96))
    run_to_idle(model)
    for i in range(1, 4):
        model.add(SimRequest(i, 300, 2, 1.0))
    run_to_idle(model, 1.0)
    model.add(SimRequest(9, 100, 2, 2.0, prefix_group=1, prefix_tokens=96))
    result = model.step(2.0)
    assert result is not None and result.shape == StepShape(100, 1, 0, 0, 5050)


def test_prefix_caching_off_never_hits() -> None:
    model = ReplicaModel(scheduler_config(enable_prefix_caching=False), COST)
    for i in range(2):
        model.add(SimRequest(i, 100, 2, 0.0, prefix_group=1, prefix_tokens=100))
    results = run_to_idle(model)
    assert sum(r.prefill_tokens for r in results) == 200
    assert model.prefix_cache_queries == 0 and model.prefix_hit_rate == 0.0


# ---- preemption ------------------------------------------------------------------------


def test_kv_exhaustion_preempts_the_latest_and_recomputes_it() -> None:
    # 12 usable blocks; two requests of 64 + 80 tokens need 9 blocks each at the end.
    model = ReplicaModel(scheduler_config(num_blocks=13, max_model_len=160), COST)
    first = SimRequest(0, 64, 80, 0.0)
    second = SimRequest(1, 64, 80, 0.0)
    model.add(first)
    model.add(second)
    results = run_to_idle(model)
    preempted = [rid for r in results for rid in r.preempted]
    assert preempted and set(preempted) == {1}
    assert second.num_preemptions == len(preempted) == model.num_preemptions
    assert first.num_preemptions == 0
    assert first.finish_step < second.finish_step
    resumed = [gap for r in results for gap in r.resumed_gaps_s]
    assert len(resumed) == len(preempted) and all(gap > 0 for gap in resumed)
    assert sum(r.tokens for r in results) == 160


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("caching", [True, False])
def test_random_workloads_finish_every_request_once(
    seed: int, chunked: bool, caching: bool
) -> None:
    rng = random.Random(seed)
    model = ReplicaModel(
        scheduler_config(
            max_num_batched_tokens=256 if chunked else 512,
            num_blocks=rng.choice([40, 60, 200]),
            enable_chunked_prefill=chunked,
            enable_prefix_caching=caching,
            async_scheduling=seed % 2 == 1,
        ),
        COST,
    )
    requests = _random_requests(rng, 150)
    aborted = set()
    tokens: Counter[int] = Counter()
    firsts: Counter[int] = Counter()
    finished: Counter[int] = Counter()
    now, index = 0.0, 0
    while index < len(requests) or not model.idle:
        while index < len(requests) and requests[index].arrival_s <= now:
            model.add(requests[index])
            index += 1
        if seed % 3 == 0 and index and rng.random() < 0.02:
            victim = rng.randrange(index)
            model.abort(victim)
            aborted.add(victim)
        result = model.step(now)
        if result is None:
            now = requests[index].arrival_s
            continue
        model.check()
        emitted = model.last_step_token_ids(result)
        assert result.tokens == len(emitted)
        tokens.update(emitted)
        firsts.update(result.first_tokens)
        finished.update(r.request_id for r in result.finished)
        now = result.end_s
    for request in requests:
        if request.state is RequestState.ABORTED:
            assert request.request_id in aborted and finished[request.request_id] == 0
            continue
        assert finished[request.request_id] == 1 and firsts[request.request_id] == 1
        assert tokens[request.request_id] == request.output_tokens
        assert request.finish_step - request.first_token_step >= request.output_tokens - 1


def _random_requests(rng: random.Random, count: int) -> list[SimRequest]:
    requests, now = [], 0.0
    for i in range(count):
        prompt = rng.randint(1, 300)
        longest = 512 - prompt
        output = rng.randint(1, longest if rng.random() < 0.1 else min(60, longest))
        group = rng.choice([None, 1, 2, 3])
        prefix = min(prompt, rng.choice([0, 40, 100, 200])) if group is not None else 0
        requests.append(SimRequest(i, prompt, output, now, group, prefix))
        now += rng.expovariate(20)
    return requests
