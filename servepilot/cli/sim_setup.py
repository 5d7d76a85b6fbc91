"""From fleet.yaml to the simulated fleet: each replica's scheduler, KV blocks and step times.

The replicas are what `servepilot up` would launch from the same file: vLLM's knobs as
configured, vLLM 0.32's defaults for those left out, and the KV cache vLLM would allocate
(plan/kv.py's `kv_cache_shape` over the configured memory: on CPU exactly
`engine.cpu_kv_cache_space_gib`, on GPU the planner's estimate of what is left after weights,
activations and runtime at `gpu_memory_utilization`). Step times come from a calibrated
profile (`--profile`, schema servepilot.costmodel/v1) or else from the planner's roofline of
the model on the accelerator. The gateway gives each replica the concurrency budget `up`
gives it (fleet/budget.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.cli.plan_cmd import build_request
from servepilot.core.config import FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.engine.args import cpu_kv_cache_bytes
from servepilot.engine.startup_log import KvCapacity
from servepilot.fleet.budget import replica_capacity
from servepilot.plan.costmodel import CostModel, load_profile, roofline_cost_model
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.knobs import vllm_defaults
from servepilot.plan.kv import KvCacheShape, kv_cache_shape, vllm_default_block_size
from servepilot.plan.memory import device_memory
from servepilot.plan.parallel import Parallelism
from servepilot.plan.request import PlanRequest
from servepilot.sim.records import SchedulerConfig


@dataclass(frozen=True, slots=True)
class ReplicaSetup:
    """One simulated replica, and where each of its numbers came from."""

    scheduler: SchedulerConfig
    cost: CostModel
    cost_kind: str
    """"profile" or "roofline"."""
    capacity: int
    kv_bytes: int
    kv_capacity_tokens: int
    prompt_overhead_tokens: int
    """Tokens the server adds to every prompt (chat template), from the profile's meta."""
    replicas_per_node: int
    model_name: str
    notes: tuple[str, ...] = ()


def replica_setup(config: FleetConfig, profile: Path | None) -> ReplicaSetup:
    request = build_request(config, None, None)
    engine = config.engine
    if engine.data_parallel_size > 1:
        raise ConfigError(
            "engine.data_parallel_size > 1 is not simulated yet (each DP rank is its own "
            "scheduler and KV pool)",
            hint="simulate the DP ranks as replicas: replicas.count x data_parallel_size",
        )
    scheduler, shape, kv_bytes = _scheduler(config, request)
    notes: list[str] = []
    if len(shape.groups) > 1:
        notes.append(
            f"{request.model.name} has {len(shape.groups)} KV cache groups; the simulator "
            "models one group of full-attention blocks holding the tokens vLLM reports"
        )
    cost, kind, overhead = _cost(request, shape, engine.tensor_parallel_size, profile, notes)
    capacity_tokens = shape.capacity_tokens(kv_bytes, scheduler.max_model_len)
    devices = engine.tensor_parallel_size * engine.pipeline_parallel_size
    cpu = request.accelerator.kind is AcceleratorKind.CPU
    return ReplicaSetup(
        scheduler=scheduler,
        cost=cost,
        cost_kind=kind,
        capacity=replica_capacity(config, KvCapacity(capacity_tokens, None, None)),
        kv_bytes=kv_bytes,
        kv_capacity_tokens=capacity_tokens,
        prompt_overhead_tokens=overhead,
        replicas_per_node=max(
            1, config.replicas.count if cpu else config.hardware.count // devices
        ),
        model_name=config.model.served_name or request.model.name,
        notes=tuple(notes),
    )


def _scheduler(
    config: FleetConfig, request: PlanRequest
) -> tuple[SchedulerConfig, KvCacheShape, int]:
    engine, spec, acc = config.engine, request.model, request.accelerator
    cpu = acc.kind is AcceleratorKind.CPU
    default_batched, default_seqs = vllm_defaults(acc)
    seqs = engine.max_num_seqs or default_seqs
    batched = engine.max_num_batched_tokens or max(default_batched, seqs)
    model_len = engine.max_model_len or spec.max_position_embeddings
    if model_len > spec.max_position_embeddings:
        raise ConfigError(
            f"engine.max_model_len {model_len:,} is above {spec.name}'s "
            f"{spec.max_position_embeddings:,} positions; vLLM refuses it"
        )
    par = Parallelism(
        tp=engine.tensor_parallel_size,
        pp=engine.pipeline_parallel_size,
        expert_parallel=engine.enable_expert_parallel,
    )
    weights = request.weights_dtype
    shape = kv_cache_shape(
        spec,
        kv_dtype=request.kv_dtype,
        compute_dtype=WeightDtype.FP32 if weights is WeightDtype.FP32 else WeightDtype.BF16,
        tp=par.tp,
        pp=par.pp,
        block_size=engine.block_size or vllm_default_block_size(spec.attention, cpu=cpu),
        max_num_batched_tokens=batched,
    )
    kv_bytes = _kv_bytes(config, request, par, batched, seqs)
    scheduler = SchedulerConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        max_model_len=model_len,
        block_size=shape.block_size_tokens,
        num_blocks=_num_blocks(shape, kv_bytes, model_len),
        enable_chunked_prefill=engine.enable_chunked_prefill is not False,
        enable_prefix_caching=engine.enable_prefix_caching is not False,
        async_scheduling=not cpu,  # vLLM's default on GPUs; vLLM-CPU forces it off
    )
    return scheduler, shape, kv_bytes


def _kv_bytes(
    config: FleetConfig, request: PlanRequest, par: Parallelism, batched: int, seqs: int
) -> int:
    """What vLLM gives the KV cache: on CPU the configured space, to the byte; on GPU the
    planner's estimate of what weights, activations and runtime leave."""
    engine, spec, acc = config.engine, request.model, request.accelerator
    if acc.kind is AcceleratorKind.CPU:
        kv_bytes = cpu_kv_cache_bytes(engine)
    else:
        kv_bytes = device_memory(
            spec, acc, par, weights_dtype=request.weights_dtype,
            gpu_memory_utilization=engine.gpu_memory_utilization, batched_tokens=batched,
            max_num_seqs=seqs, cuda_graphs=not engine.enforce_eager,
        ).kv_bytes  # fmt: skip
    if kv_bytes <= 0:
        raise ConfigError(
            f"{spec.name} does not fit {acc.name} with this layout: no memory is left for the "
            "KV cache",
            hint="see `servepilot plan -c fleet.yaml` for what fits",
        )
    return kv_bytes


def _num_blocks(shape: KvCacheShape, kv_bytes: int, max_model_len: int) -> int:
    """vLLM's num_gpu_blocks. With several KV cache groups (sliding windows, compressed
    layers) every request takes blocks of each group from one pool; the simulator models one
    group, so it gets the blocks that hold the tokens vLLM reports ("KV cache size")."""
    if len(shape.groups) == 1:
        return shape.num_blocks(kv_bytes)
    return shape.capacity_tokens(kv_bytes, max_model_len) // shape.block_size_tokens + 1


def _cost(
    request: PlanRequest, shape: KvCacheShape, tp: int, profile: Path | None, notes: list[str]
) -> tuple[CostModel, str, int]:
    if profile is not None:
        model = load_profile(profile)
        return model, "profile", _overhead(_meta(profile), profile)
    model = roofline_cost_model(
        request.model,
        request.accelerator,
        weights_dtype=request.weights_dtype,
        kv_bytes_per_token=shape.bytes_per_token,
        tp=tp,
    )
    notes.append("roofline step times: an estimate from peak rates; calibrate for accuracy")
    return model, "roofline", 0


def _meta(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text(encoding="utf-8"))  # load_profile checked it
    meta = document.get("meta", {})
    return meta if isinstance(meta, dict) else {}


def _overhead(meta: dict[str, Any], path: Path) -> int:
    value = meta.get("prompt_overhead_tokens", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"{path}: meta.prompt_overhead_tokens: expected a whole number >= 0, got {value!r}"
        )
    return value
