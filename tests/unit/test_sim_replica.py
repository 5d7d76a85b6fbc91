"""The simulated vLLM engine (servepilot/sim): known answers, invariants, and vLLM itself.

The last tests run vLLM 0.32's own v1 Scheduler (with its KV cache manager and block pool)
side by side with ReplicaModel on random workloads, feeding it token ids that share a prefix
exactly where the simulated requests share a prefix group, and check that both schedule the
same number of tokens and sequences, preempt the same requests, finish the same requests,
report the same KV usage and the same prefix-cache hits, step after step.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import CostModel, StepShape, prefill_pairs
from servepilot.sim import ReplicaModel, RequestState, SchedulerConfig, SimRequest, StepResult

COST = CostModel(
    base_s=0.01,
    per_prefill_token_s=1e-4,
    per_prefill_seq_s=1e-3,
    per_decode_seq_s=2e-3,
    per_context_token_s=1e-6,
    per_prefill_pair_s=0.0,
    source="test",
)


def _config(**changes: Any) -> SchedulerConfig:
    fields: dict[str, Any] = dict(
        max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512, block_size=16
    )
    fields["num_blocks"] = 400
    return SchedulerConfig(**(fields | changes))


def _run(model: ReplicaModel, now: float = 0.0) -> list[StepResult]:
    """Step until idle, checking the books after every step."""
    results = []
    while (result := model.step(now)) is not None:
        model.check()
        results.append(result)
        now = result.end_s
    return results


# ---- one request ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "output", "budget"),
    [(100, 5, 64), (64, 1, 64), (1, 3, 16), (1000, 10, 256), (513, 40, 512), (17, 2, 16)],
)
def test_one_request_prefills_in_chunks_then_decodes(prompt: int, output: int, budget: int) -> None:
    model = ReplicaModel(
        _config(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=2048), COST
    )
    request = SimRequest(7, prompt, output, arrival_s=0.0)
    model.add(request)
    results = _run(model)
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
    model = ReplicaModel(_config(), COST)
    for i in range(6):
        model.add(SimRequest(i, 40 + 13 * i, 5 + i, 0.0))
    now = 3.0
    for result in _run(model, now):
        assert result.duration_s == COST.step_time_s(result.shape)
        assert result.start_s == now
        now = result.end_s


def test_decode_tokens_come_one_step_apart() -> None:
    # TPOT and ITL from the step ends alone: a decoding request's tokens are the ends of
    # consecutive steps, and each decode token's gap is its step's itl_s.
    model = ReplicaModel(_config(max_num_batched_tokens=128), COST)
    requests = [SimRequest(i, 50 * (i + 1), 6, 0.0) for i in range(3)]
    for request in requests:
        model.add(request)
    results = _run(model)
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
    model = ReplicaModel(_config(max_num_seqs=3, max_num_batched_tokens=512), COST)
    for i in range(7):
        model.add(SimRequest(i, 10, 4 + i, 0.0))
    first = model.step(0.0)
    assert first is not None and first.first_tokens == (0, 1, 2)
    assert model.num_running == 3 and model.num_waiting == 4
    results = [first, *_run(model, first.end_s)]
    assert max(r.prefill_seqs + r.decode_seqs for r in results) == 3
    # Request 3 starts in the step after request 0 (the shortest) finished.
    finished_0 = next(i for i, r in enumerate(results) if 0 in [q.request_id for q in r.finished])
    assert 3 in results[finished_0 + 1].first_tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_async_scheduling_frees_a_finished_slot_one_step_later(async_scheduling: bool) -> None:
    model = ReplicaModel(_config(max_num_seqs=2, async_scheduling=async_scheduling), COST)
    model.add(SimRequest(0, 10, 20, 0.0))
    model.add(SimRequest(1, 10, 3, 0.0))
    model.add(SimRequest(2, 10, 3, 0.0))
    results = _run(model)
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
    model = ReplicaModel(_config(max_num_seqs=1, async_scheduling=async_scheduling), COST)
    model.add(SimRequest(0, 10, 3, 0.0))
    model.add(SimRequest(1, 10, 3, 0.0))
    results = _run(model)
    assert [r.first_tokens for r in results] == [(0,), (), (), (1,), (), ()]


def test_waiting_requests_start_first_come_first_served() -> None:
    model = ReplicaModel(_config(max_num_seqs=2, max_num_batched_tokens=256), COST)
    for i in range(6):
        model.add(SimRequest(i, 30, 3, float(i)))
    order = [rid for result in _run(model) for rid in result.first_tokens]
    assert order == list(range(6))


def test_running_requests_are_scheduled_before_waiting_ones() -> None:
    model = ReplicaModel(_config(max_num_batched_tokens=64), COST)
    model.add(SimRequest(0, 100, 5, 0.0))
    model.step(0.0)  # 64 of request 0's 100 prompt tokens
    model.add(SimRequest(1, 100, 5, 0.0))
    result = model.step(1.0)
    # Request 0's remaining 36 first, then request 1 gets what is left of the budget.
    assert result is not None and result.prefill_tokens == 64 and result.prefill_seqs == 2
    assert result.first_tokens == (0,)
    assert result.context_tokens == 64


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    chunked = ReplicaModel(_config(max_num_batched_tokens=512), COST)
    whole = ReplicaModel(_config(max_num_batched_tokens=512, enable_chunked_prefill=False), COST)
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
    model = ReplicaModel(_config(num_blocks=21, max_model_len=320), COST)
    model.add(SimRequest(0, 200, 60, 0.0))
    model.add(SimRequest(1, 200, 5, 0.0))
    results = _run(model)
    first_token_steps = [i for i, r in enumerate(results) if r.first_tokens]
    assert [results[i].first_tokens for i in first_token_steps] == [(0,), (1,)]
    assert all(r.prefill_seqs + r.decode_seqs <= 1 for r in results)
    assert model.num_preemptions == 0


# ---- prefix caching --------------------------------------------------------------------


def test_second_request_of_a_group_skips_the_cached_prefix() -> None:
    model = ReplicaModel(_config(max_num_batched_tokens=512), COST)
    model.add(SimRequest(0, 150, 3, 0.0, prefix_group=9, prefix_tokens=100))
    _run(model)
    model.add(SimRequest(1, 130, 3, 1.0, prefix_group=9, prefix_tokens=100))
    result = model.step(1.0)
    # 100 shared tokens fill 6 blocks of 16: 96 tokens hit, 34 are computed.
    assert result is not None and result.shape == StepShape(34, 1, 0, 96, prefill_pairs(34, 96))
    assert model.prefix_cache_queries == 150 + 130
    assert model.prefix_cache_hits == 96
    assert model.prefix_hit_rate == pytest.approx(96 / 280)


def test_concurrent_requests_of_a_group_share_blocks() -> None:
    model = ReplicaModel(_config(max_num_batched_tokens=512), COST)
    for i in range(3):
        model.add(SimRequest(i, 120, 20, 0.0, prefix_group=1, prefix_tokens=100))
    result = model.step(0.0)
    # vLLM caches a block when it is scheduled: requests later in the same step hit it.
    assert result is not None and result.shape == StepShape(
        120 + 24 + 24, 3, 0, 96 * 2, prefill_pairs(120, 0) + 2 * prefill_pairs(24, 96)
    )
    shared_once = 6 + 3 * 2  # the group's 6 blocks once, then 2 own blocks each (24 + 1)
    assert model.kv_usage == pytest.approx(shared_once / 399)


def test_a_prompt_all_prefix_still_computes_its_last_token() -> None:
    model = ReplicaModel(_config(), COST)
    model.add(SimRequest(0, 64, 2, 0.0, prefix_group=1, prefix_tokens=64))
    _run(model)
    model.add(SimRequest(1, 64, 2, 0.0, prefix_group=1, prefix_tokens=64))
    result = model.step(10.0)
    # 4 full blocks cached, but the last token must be computed: 3 blocks hit.
    assert result is not None and result.shape == StepShape(16, 1, 0, 48, prefill_pairs(16, 48))


def test_cached_prefix_is_evicted_least_recently_used_first() -> None:
    # 30 usable blocks; group 1's 6 blocks go to the free queue when request 0 finishes,
    # then unique requests fill the pool and evict them.
    model = ReplicaModel(
        _config(num_blocks=31, max_num_batched_tokens=512, max_model_len=320), COST
    )
    model.add(SimRequest(0, 100, 2, 0.0, prefix_group=1, prefix_tokens=96))
    _run(model)
    for i in range(1, 4):
        model.add(SimRequest(i, 300, 2, 1.0))
    _run(model, 1.0)
    model.add(SimRequest(9, 100, 2, 2.0, prefix_group=1, prefix_tokens=96))
    result = model.step(2.0)
    assert result is not None and result.shape == StepShape(100, 1, 0, 0, 5050)


def test_prefix_caching_off_never_hits() -> None:
    model = ReplicaModel(_config(enable_prefix_caching=False), COST)
    for i in range(2):
        model.add(SimRequest(i, 100, 2, 0.0, prefix_group=1, prefix_tokens=100))
    results = _run(model)
    assert sum(r.prefill_tokens for r in results) == 200
    assert model.prefix_cache_queries == 0 and model.prefix_hit_rate == 0.0


# ---- preemption ------------------------------------------------------------------------


def test_kv_exhaustion_preempts_the_latest_and_recomputes_it() -> None:
    # 12 usable blocks; two requests of 64 + 80 tokens need 9 blocks each at the end.
    model = ReplicaModel(_config(num_blocks=13, max_model_len=160), COST)
    first = SimRequest(0, 64, 80, 0.0)
    second = SimRequest(1, 64, 80, 0.0)
    model.add(first)
    model.add(second)
    results = _run(model)
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
        _config(
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


# ---- the API's edges -------------------------------------------------------------------


def test_abort_frees_a_waiting_or_running_request() -> None:
    model = ReplicaModel(_config(max_num_seqs=1), COST)
    model.add(SimRequest(0, 100, 50, 0.0))
    model.add(SimRequest(1, 10, 5, 0.0))
    model.step(0.0)
    model.abort(1)
    assert model.num_waiting == 0
    model.abort(0)
    model.check()
    assert model.idle and model.kv_usage == 0.0
    model.abort(0)  # unknown now: ignored
    assert model.step(1.0) is None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (SimRequest(1, 0, 5, 0.0), "at least one token"),
        (SimRequest(1, 5, 0, 0.0), "at least one token"),
        (SimRequest(1, 500, 13, 0.0), "513 tokens .* exceed max_model_len 512"),
        (SimRequest(1, 50, 5, 0.0, prefix_group=1, prefix_tokens=51), "within the prompt"),
    ],
)
def test_add_refuses_what_vllm_refuses(bad: SimRequest, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplicaModel(_config(), COST).add(bad)


def test_a_step_cannot_start_before_the_last_one_ended() -> None:
    model = ReplicaModel(_config(), COST)
    model.add(SimRequest(1, 5, 5, 0.0))
    result = model.step(1.0)
    assert result is not None
    with pytest.raises(ValueError, match="before the last one ended"):
        model.step(result.end_s - 1e-3)


def test_add_refuses_a_request_twice() -> None:
    model = ReplicaModel(_config(), COST)
    request = SimRequest(1, 5, 5, 0.0)
    model.add(request)
    with pytest.raises(ValueError, match="already added"):
        model.add(request)
    with pytest.raises(ValueError, match="already added"):
        model.add(SimRequest(1, 5, 5, 0.0))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
        ({"max_num_seqs": 100, "max_num_batched_tokens": 64}, "must be >= max_num_seqs"),
        ({"enable_chunked_prefill": False}, "without chunked prefill"),
        ({"num_blocks": 32}, "cannot hold one request of max_model_len"),
    ],
)
def test_config_refuses_what_vllm_refuses(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(**changes)


# ---- against vLLM's own scheduler -------------------------------------------------------

_SCENARIOS = [
    dict(
        max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512, block_size=16, num_blocks=60
    ),
    dict(
        max_num_seqs=16,
        max_num_batched_tokens=512,
        max_model_len=512,
        block_size=16,
        num_blocks=400,
    ),
    dict(
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=512,
        block_size=16,
        num_blocks=80,
        enable_chunked_prefill=False,
    ),
    dict(
        max_num_seqs=8,
        max_num_batched_tokens=128,
        max_model_len=512,
        block_size=16,
        num_blocks=70,
        enable_prefix_caching=False,
    ),
]
# A small Llama: vLLM's configs need a model folder; the scheduler never runs it.
_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
}


class VllmScheduler:
    """vLLM 0.32's v1 Scheduler (AsyncScheduler with async scheduling), its KV cache manager
    and its block pool, with no model: each step's output is a distinct token for every
    request whose prefill is done. With async scheduling the steps are pipelined as vLLM's
    engine core does (EngineCore.step_with_batch_queue): step N+1 is scheduled before step
    N's output is processed."""

    def __init__(self, config: SchedulerConfig, model_dir: Path) -> None:
        import torch
        from vllm import config as vconfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        init_none_hash(sha256)
        vllm_config = vconfig.VllmConfig(
            scheduler_config=vconfig.SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=config.max_model_len,
                enable_chunked_prefill=config.enable_chunked_prefill,
                is_encoder_decoder=False,
            ),
            model_config=vconfig.ModelConfig(
                model=str(model_dir),
                dtype="float16",
                seed=0,
                skip_tokenizer_init=True,
                max_model_len=config.max_model_len,
            ),
            cache_config=vconfig.CacheConfig(
                block_size=config.block_size,
                enable_prefix_caching=config.enable_prefix_caching,
            ),
        )
        spec = FullAttentionSpec(
            block_size=config.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
        )
        kv_config = KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
        )
        vllm_config.cache_config.num_gpu_blocks = config.num_blocks
        # vLLM on this CPU turns async scheduling off in the config; the class is what
        # implements it.
        scheduler_class = AsyncScheduler if config.async_scheduling else Scheduler
        self.scheduler = scheduler_class(
            vllm_config=vllm_config,
            kv_cache_config=kv_config,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=config.block_size,
        )
        self.pipelined = config.async_scheduling
        self.pending: tuple[Any, Any] | None = None
        self.hasher = get_request_block_hasher(config.block_size, sha256)
        self.queries = self.hits = 0

    def add(self, request: SimRequest) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        # Token ids: the group's shared prefix, then the request's own.
        shared = []
        if request.prefix_group is not None:
            base = 100_000_000 * (request.prefix_group + 1)
            shared = [base + j for j in range(request.prefix_tokens)]
        own_base = 10_000_000 + request.request_id * 1000
        own = [own_base + j for j in range(request.prompt_tokens - request.prefix_tokens)]
        params = SamplingParams(max_tokens=request.output_tokens, ignore_eos=True)
        self.scheduler.add_request(
            Request(
                str(request.request_id),
                shared + own,
                params,
                None,
                arrival_time=request.arrival_s,
                block_hasher=self.hasher,
            )
        )

    def abort(self, request_id: int) -> None:
        from vllm.v1.request import RequestStatus

        if str(request_id) in self.scheduler.requests:
            self.scheduler.finish_requests(str(request_id), RequestStatus.FINISHED_ABORTED)

    def step(self) -> dict[str, Any]:
        """The next step that runs something; `finished` is what the last processed output
        finished (this step's in sync mode, the previous one's when pipelined)."""
        scheduler = self.scheduler
        while True:
            output, runner_output = self._schedule()
            if self.pipelined:
                finished = self.flush()
                self.pending = (output, runner_output)
            else:
                finished = self._process(output, runner_output)
            # Pipelined, a step may schedule nothing while finished requests drain.
            if output.total_num_scheduled_tokens or not scheduler.has_requests():
                break
        ids = list(output.num_scheduled_tokens)
        return {
            "tokens": output.total_num_scheduled_tokens,
            "seqs": len(ids),
            "preempted": sorted(int(rid) for rid in output.preempted_req_ids or ()),
            "emitted": sorted(
                int(rid) for rid, s in zip(ids, runner_output.sampled_token_ids, strict=True) if s
            ),
            "finished": finished,
            "running": len(scheduler.running),
            "waiting": len(scheduler.waiting),
            "kv_usage": scheduler.kv_cache_manager.usage,
        }

    def flush(self) -> list[int]:
        """Process the pending output (pipelined mode); the requests it finished."""
        if self.pending is None:
            return []
        output, runner_output = self.pending
        self.pending = None
        return self._process(output, runner_output)

    def _schedule(self) -> tuple[Any, Any]:
        from vllm.v1.outputs import ModelRunnerOutput

        scheduler = self.scheduler
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            request = scheduler.requests[rid]
            token = 50_000_000 + int(rid) * 1000 + request.num_computed_tokens
            sampled.append([] if request.is_prefill_chunk else [token])
        runner_output = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}
        )
        runner_output.sampled_token_ids = sampled
        return output, runner_output

    def _process(self, output: Any, runner_output: Any) -> list[int]:
        finished = []
        for engine_output in self.scheduler.update_from_output(output, runner_output).values():
            finished += [int(o.request_id) for o in engine_output.outputs if o.finish_reason]
            stats = engine_output.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                self.queries += stats.prefix_cache_stats.queries
                self.hits += stats.prefix_cache_stats.hits
        return sorted(finished)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("vllm")
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(_TINY_LLAMA))
    return folder


def _oracle_requests(rng: random.Random, count: int) -> list[SimRequest]:
    """Arrivals with shared prefixes of several lengths per group (half or all of the
    group's), prompts that are all prefix, and outputs long enough to fill the cache."""
    groups = rng.choice([1, 3, 10])
    lengths = {g: rng.choice([20, 40, 100, 200]) for g in range(groups)}
    requests, now = [], 0.0
    for i in range(count):
        group = rng.randrange(groups) if rng.random() < 0.7 else None
        prefix = 0
        if group is not None:
            prefix = lengths[group] if rng.random() < 0.5 else lengths[group] // 2
        prompt = prefix + (0 if prefix and rng.random() < 0.2 else rng.randint(1, 150))
        output = rng.randint(1, min(80, 512 - prompt))
        requests.append(SimRequest(i, prompt, output, now, group, prefix))
        now += rng.expovariate(30)
    return requests


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("scenario", range(len(_SCENARIOS)))
def test_matches_vllms_scheduler_step_by_step(
    tiny_model_dir: Path, scenario: int, seed: int, async_scheduling: bool
) -> None:
    config = SchedulerConfig(**_SCENARIOS[scenario], async_scheduling=async_scheduling)
    rng = random.Random(seed)
    requests = _oracle_requests(rng, 120)
    vllm = VllmScheduler(config, tiny_model_dir)
    model = ReplicaModel(config, COST)
    now, index, step, preemptions = 0.0, 0, 0, 0
    reported: list[int] = []  # finished requests vLLM has yet to report (pipelined)
    while index < len(requests) or not model.idle:
        while index < len(requests) and requests[index].arrival_s <= now:
            request = requests[index]
            model.add(request)
            vllm.add(request)
            index += 1
        if index and rng.random() < 0.03:
            victim = rng.randrange(index)
            model.abort(victim)
            vllm.abort(victim)
        result = model.step(now)
        if result is None:
            assert vllm.flush() == reported
            reported = []
            now = requests[index].arrival_s
            continue
        step += 1
        theirs = vllm.step()
        finished = sorted(r.request_id for r in result.finished)
        ours = {
            "tokens": result.prefill_tokens + result.decode_seqs,
            "seqs": result.prefill_seqs + result.decode_seqs,
            "preempted": sorted(result.preempted),
            "emitted": sorted(model.last_step_token_ids(result)),
            "finished": reported if async_scheduling else finished,
            # With async scheduling, vLLM still lists the requests finished this step.
            "running": model.num_running + (len(finished) if async_scheduling else 0),
            "waiting": model.num_waiting,
            "kv_usage": pytest.approx(theirs["kv_usage"], abs=1e-9),
        }
        assert ours == theirs, f"step {step}"
        reported = finished if async_scheduling else []
        preemptions += len(result.preempted)
        now = result.end_s
    assert vllm.flush() == reported
    assert (model.prefix_cache_queries, model.prefix_cache_hits) == (vllm.queries, vllm.hits)
    if scenario == 0:
        assert preemptions > 0  # the scenario is meant to run out of blocks
