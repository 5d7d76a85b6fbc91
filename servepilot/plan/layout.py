"""Choose how to spread the model over the accelerators, and how many replicas that makes.

Rules, in order (seed 004 and vLLM's DeepSeek recipe):
1. Tensor parallelism stays inside one NVLink domain (one node); a model that needs more
   memory than a node has is split into pipeline stages across nodes.
2. The smallest TP that leaves the KV cache at least the seed's share of memory (35%) wins;
   more TP than that buys nothing but communication, fewer leaves no room for concurrency.
3. MoE models add expert parallelism across the TP ranks.
4. MLA models keep one latent KV head, replicated on every TP rank, so TP adds no KV room;
   when the KV cache is what limits concurrency, data-parallel attention (DP x EP) gives
   every rank its own KV pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.hardware import Accelerator, AcceleratorKind
from servepilot.plan.kv import KvCacheShape, kv_cache_shape, vllm_default_block_size
from servepilot.plan.kv_offload import KvOffload, cpu_tier_tokens
from servepilot.plan.memory import DeviceMemory, device_memory
from servepilot.plan.parallel import Parallelism
from servepilot.plan.spec import AttentionKind, ModelSpec

# Seed 004's memory pie for one GPU: weights 55%, KV cache 35%, framework/activations 10%.
KV_SHARE_TARGET = 0.35


@dataclass(frozen=True, slots=True)
class Setting:
    """Everything a layout is evaluated under."""

    spec: ModelSpec
    accelerator: Accelerator
    count: int
    nodes: int
    weights_dtype: WeightDtype
    kv_dtype: KvDtype
    gpu_memory_utilization: float
    max_model_len: int
    batched_tokens: int
    max_num_seqs: int
    block_size: int | None
    """None: vLLM's default for the model and device."""
    cuda_graphs: bool
    kv_offload: KvOffload | None = None
    """The CPU tier of the KV cache (GPU only); None: none."""
    replicas_per_device: int = 1
    """Replicas sharing each group of `par.devices` accelerators (hardware.replicas_per_gpu);
    gpu_memory_utilization is each one's share."""

    @property
    def compute_dtype(self) -> WeightDtype:
        """Activations (and `auto` KV) run in 16 bits unless the weights are fp32."""
        return WeightDtype.FP32 if self.weights_dtype is WeightDtype.FP32 else WeightDtype.BF16


@dataclass(frozen=True, slots=True)
class Option:
    """One layout, evaluated."""

    parallelism: Parallelism
    memory: DeviceMemory
    kv: KvCacheShape
    kv_capacity_tokens: int
    """Tokens one replica's KV cache holds (all its DP pools together)."""
    max_concurrency: float
    """Requests of max_model_len tokens one replica holds at once."""
    fits: bool
    """vLLM would start: the weights fit and one request of max_model_len fits the KV cache."""
    replicas: int
    kv_cpu_tokens: int | None = None
    """Tokens one replica's CPU tier holds (engine.kv_offload_gib); None: no CPU tier."""
    replicas_per_device: int = 1
    """Replicas sharing each group of the layout's accelerators."""

    @property
    def kv_share(self) -> float:
        return max(0, self.memory.kv_bytes) / self.memory.usable_bytes

    def shortfall_bytes(self, max_model_len: int) -> int:
        """Memory per rank missing for one request of max_model_len (0 when it fits)."""
        need = self.kv.request_bytes(max_model_len) + self.kv.bytes_per_block
        return 0 if self.fits else max(0, need - self.memory.kv_bytes)


def evaluate(setting: Setting, par: Parallelism) -> Option:
    mem = device_memory(
        setting.spec,
        setting.accelerator,
        par,
        weights_dtype=setting.weights_dtype,
        gpu_memory_utilization=setting.gpu_memory_utilization,
        batched_tokens=setting.batched_tokens,
        max_num_seqs=setting.max_num_seqs,
        cuda_graphs=setting.cuda_graphs,
    )
    cpu = setting.accelerator.kind is AcceleratorKind.CPU
    shape = kv_cache_shape(
        setting.spec,
        kv_dtype=setting.kv_dtype,
        compute_dtype=setting.compute_dtype,
        tp=par.tp,
        pp=par.pp,
        block_size=setting.block_size or vllm_default_block_size(setting.spec.attention, cpu=cpu),
        max_num_batched_tokens=setting.batched_tokens,
    )
    pool_bytes = max(0, mem.kv_bytes)
    offload = setting.kv_offload
    return Option(
        parallelism=par,
        memory=mem,
        kv=shape,
        kv_capacity_tokens=shape.capacity_tokens(pool_bytes, setting.max_model_len) * par.kv_pools,
        max_concurrency=shape.max_concurrency(pool_bytes, setting.max_model_len) * par.kv_pools,
        fits=mem.fits and shape.fits(pool_bytes, setting.max_model_len),
        kv_cpu_tokens=None if offload is None else cpu_tier_tokens(offload, shape, par),
        replicas=(setting.count * setting.nodes) // par.devices * setting.replicas_per_device,
        replicas_per_device=setting.replicas_per_device,
    )


def candidates(setting: Setting) -> Iterator[Parallelism]:
    """Every layout worth evaluating: TP within a node, PP across nodes, DP attention for MLA."""
    spec, acc = setting.spec, setting.accelerator
    if acc.kind is AcceleratorKind.CPU:
        yield Parallelism()
        return
    moe = spec.moe is not None
    domain = min(setting.count, max(1, acc.tp_domain))
    for tp in _powers_of_two(domain):
        if setting.count % tp or not _tp_divides_heads(spec, tp):
            continue
        yield Parallelism(tp=tp, expert_parallel=moe and tp > 1)
    full = max(tp for tp in _powers_of_two(domain) if setting.count % tp == 0)
    for pp in range(2, setting.nodes + 1):
        if setting.nodes % pp == 0 and spec.num_layers >= pp:
            yield Parallelism(tp=full, pp=pp, expert_parallel=moe)
    if spec.attention is not AttentionKind.GQA and moe and setting.count > 1:
        yield Parallelism(tp=1, dp=setting.count, expert_parallel=True)


def choose(options: list[Option], needed_tokens: int) -> tuple[Option | None, str]:
    """The layout to use and why. `needed_tokens`: KV the traffic wants held at once."""
    fitting = [o for o in options if o.fits]
    if not fitting:
        return None, "no layout fits"
    fewest_stages = min(o.parallelism.pp for o in fitting)
    plain = [o for o in fitting if o.parallelism.pp == fewest_stages and o.parallelism.dp == 1]
    dp_attention = [o for o in fitting if o.parallelism.dp > 1]
    chosen, why = _smallest_tp(plain) if plain else (None, "")
    if chosen is None:
        best = max(dp_attention, key=lambda o: o.kv_capacity_tokens)
        return best, "data-parallel attention is the only layout that fits"
    if fewest_stages > 1:
        why = f"the weights need {fewest_stages} nodes: one pipeline stage per node, TP inside each"
    if dp_attention and chosen.kv_capacity_tokens < needed_tokens:
        best = max(dp_attention, key=lambda o: o.kv_capacity_tokens)
        if best.kv_capacity_tokens > chosen.kv_capacity_tokens:
            return best, (
                "MLA keeps one KV head replicated on every TP rank, so "
                f"{chosen.parallelism.describe()} holds {chosen.kv_capacity_tokens:,} tokens, "
                f"less than the {needed_tokens:,} the traffic needs; DP attention gives each "
                f"rank its own pool ({best.kv_capacity_tokens:,} tokens), like vLLM's DP+EP "
                "recipe for high load"
            )
    return chosen, why


def _smallest_tp(options: list[Option]) -> tuple[Option | None, str]:
    ordered = sorted(options, key=lambda o: o.parallelism.tp)
    for option in ordered:
        if option.kv_share >= KV_SHARE_TARGET:
            if option.parallelism.tp == 1:
                shared = option.replicas_per_device
                each = "its own replica" if shared == 1 else f"{shared} replicas"
                return option, (
                    "the model fits one accelerator with room for the KV cache; every "
                    f"accelerator runs {each}"
                )
            return option, (
                f"the smallest TP inside the NVLink domain that leaves the KV cache "
                f"{option.kv_share:.0%} of memory (the KV-a-third-of-memory budget: about 35%)"
            )
    largest = ordered[-1]
    return largest, (
        f"TP fills the NVLink domain (the TP-inside-NVLink rule); the KV cache still gets only "
        f"{largest.kv_share:.0%} of memory"
    )


def _tp_divides_heads(spec: ModelSpec, tp: int) -> bool:
    """vLLM shards attention heads evenly; KV heads are split, or replicated when TP is a
    multiple of them."""
    kv = spec.num_kv_heads
    return spec.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def _powers_of_two(limit: int) -> list[int]:
    out, value = [], 1
    while value <= limit:
        out.append(value)
        value *= 2
    return out
