"""What vLLM derives from its knobs at startup: the scheduler's limits and the KV blocks.

One derivation for both ways into the simulator, so they cannot drift apart: `servepilot sim`
reads the knobs from fleet.yaml (sim/fleet/setup.py), a simulated replica from the vLLM flags
`servepilot up` passes it (server_config.py); tests/unit/test_sim_engine_setup.py pins that
the two agree. vLLM 0.32's defaults fill the knobs left out, and the KV cache is plan/kv.py's
`kv_cache_shape` over the memory vLLM would give it: on CPU the configured space, to the
byte; on GPU the planner's estimate of what weights, activations and runtime leave at
`gpu_memory_utilization`.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.config import DEFAULT_GPU_MEMORY_UTILIZATION
from servepilot.core.errors import ConfigError
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.hardware import Accelerator, AcceleratorKind
from servepilot.plan.knobs import engine_defaults
from servepilot.plan.kv import KvCacheShape, kv_cache_shape, vllm_default_block_size
from servepilot.plan.memory import device_memory
from servepilot.plan.parallel import Parallelism
from servepilot.plan.spec import ModelSpec
from servepilot.sim.engine.records import SchedulerConfig

# vLLM-CPU's KV cache space when neither --kv-cache-memory-bytes nor VLLM_CPU_KVCACHE_SPACE
# is given (vllm/platforms/cpu.py).
CPU_DEFAULT_KV_BYTES = 4 * 2**30


@dataclass(frozen=True, slots=True)
class EngineKnobs:
    """vLLM's knobs as given (vLLM's names); None keeps vLLM's default."""

    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    async_scheduling: bool | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_memory_bytes: int | None = None
    """The KV cache's size. None: 4 GiB on CPU, what `gpu_memory_utilization` leaves on GPU."""
    enforce_eager: bool = False


@dataclass(frozen=True, slots=True)
class Precision:
    weights: WeightDtype
    compute: WeightDtype
    """The activations' dtype, which sizes an MLA model's KV entries (kv_cache_shape)."""
    kv: KvDtype


@dataclass(frozen=True, slots=True)
class EngineSetup:
    scheduler: SchedulerConfig
    shape: KvCacheShape
    kv_bytes: int
    kv_capacity_tokens: int
    """What vLLM reports as "KV cache size: N tokens"."""


def engine_setup(
    spec: ModelSpec, accelerator: Accelerator, knobs: EngineKnobs, precision: Precision
) -> EngineSetup:
    cpu = accelerator.kind is AcceleratorKind.CPU
    defaults = engine_defaults(
        accelerator, knobs.tensor_parallel_size * knobs.pipeline_parallel_size
    )
    model_len = knobs.max_model_len or spec.max_position_embeddings
    if model_len > spec.max_position_embeddings:
        raise ConfigError(
            f"max_model_len {model_len:,} is above {spec.name}'s "
            f"{spec.max_position_embeddings:,} positions; vLLM refuses it"
        )
    seqs = knobs.max_num_seqs or defaults.max_num_seqs
    chunked = knobs.enable_chunked_prefill is not False
    batched = knobs.max_num_batched_tokens or max(defaults.max_num_batched_tokens, seqs)
    if not chunked and knobs.max_num_batched_tokens is None:
        batched = max(batched, model_len)  # vLLM does the same without chunked prefill
    par = Parallelism(
        tp=knobs.tensor_parallel_size,
        pp=knobs.pipeline_parallel_size,
        expert_parallel=knobs.enable_expert_parallel,
    )
    shape = kv_cache_shape(
        spec,
        kv_dtype=precision.kv,
        compute_dtype=precision.compute,
        tp=par.tp,
        pp=par.pp,
        block_size=knobs.block_size or vllm_default_block_size(spec.attention, cpu=cpu),
        max_num_batched_tokens=batched,
    )
    kv_bytes = _kv_bytes(spec, accelerator, knobs, par, precision.weights, batched, seqs)
    _check_fits(shape, kv_bytes, model_len)
    capacity = shape.capacity_tokens(kv_bytes, model_len)
    scheduler = SchedulerConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        max_model_len=model_len,
        block_size=shape.block_size_tokens,
        num_blocks=_num_blocks(shape, kv_bytes, capacity),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=knobs.enable_prefix_caching is not False,
        # vLLM's default on GPUs; vLLM-CPU forces it off.
        async_scheduling=not cpu if knobs.async_scheduling is None else knobs.async_scheduling,
    )
    return EngineSetup(scheduler, shape, kv_bytes, capacity)


def _kv_bytes(
    spec: ModelSpec,
    accelerator: Accelerator,
    knobs: EngineKnobs,
    par: Parallelism,
    weights: WeightDtype,
    batched: int,
    seqs: int,
) -> int:
    if knobs.kv_cache_memory_bytes is not None:
        return knobs.kv_cache_memory_bytes
    if accelerator.kind is AcceleratorKind.CPU:
        return CPU_DEFAULT_KV_BYTES
    memory = device_memory(
        spec, accelerator, par, weights_dtype=weights,
        gpu_memory_utilization=knobs.gpu_memory_utilization, batched_tokens=batched,
        max_num_seqs=seqs, cuda_graphs=not knobs.enforce_eager,
    )  # fmt: skip
    if memory.kv_bytes <= 0:
        # vLLM's wording (kv_cache_utils.py), which engine/startup_log.py diagnoses.
        raise ConfigError(
            f"No available memory for the cache blocks: {spec.name} on {accelerator.name} "
            "with this layout leaves none for the KV cache. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
            hint="see `servepilot plan` for what fits",
        )
    return memory.kv_bytes


def _check_fits(shape: KvCacheShape, kv_bytes: int, model_len: int) -> None:
    if shape.fits(kv_bytes, model_len):
        return
    need = shape.request_bytes(model_len) / 2**30
    # vLLM's wording (kv_cache_utils.py), which engine/startup_log.py diagnoses.
    raise ConfigError(
        f"To serve at least one request with the models's max seq len ({model_len}), "
        f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache "
        f"memory ({kv_bytes / 2**30:.2f} GiB). Try increasing `gpu_memory_utilization` "
        "(or --kv-cache-memory-bytes) or decreasing `max_model_len`."
    )


def _num_blocks(shape: KvCacheShape, kv_bytes: int, capacity: int) -> int:
    """vLLM's num_gpu_blocks (null block included). The replica model keeps one group of
    full-attention blocks: for models with several cache groups (sliding windows, DeepSeek-V4)
    it gets as many blocks as the reported capacity fills."""
    if len(shape.groups) == 1:
        return shape.num_blocks(kv_bytes)
    return capacity // shape.block_size_tokens + 1
