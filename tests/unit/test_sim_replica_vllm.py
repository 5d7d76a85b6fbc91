"""The simulated vLLM engine against vLLM itself.

These tests run vLLM 0.32's own v1 Scheduler (with its KV cache manager and block pool)
side by side with ReplicaModel on random workloads, feeding it token ids that share a prefix
exactly where the simulated requests share a prefix group, and check that both schedule the
same number of tokens and sequences, preempt the same requests, finish the same requests,
report the same KV usage and the same prefix-cache hits, step after step.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest
from tests.unit.sim_replica_support import COST

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
