"""What `servepilot plan` is asked: a model, hardware, precisions, knobs and traffic."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.config import Device, FleetConfig, HardwareConfig, TrafficConfig, Weights
from servepilot.core.errors import ConfigError
from servepilot.core.slo import Slo
from servepilot.core.vllm_defaults import VllmDefaults, vllm_defaults
from servepilot.plan.costmodel import CostModel
from servepilot.plan.dtypes import (
    KvDtype,
    WeightDtype,
    parse_kv_dtype,
    parse_weight_dtype,
    quantization_weights,
    resolve_dtype,
)
from servepilot.plan.gpu_profile.table import GpuProfile
from servepilot.plan.hardware import (
    Accelerator,
    AcceleratorKind,
    get_accelerator,
    load_catalog,
    with_overrides,
)
from servepilot.plan.kv_offload import KvOffload
from servepilot.plan.parallel import Parallelism
from servepilot.plan.presets import load_model
from servepilot.plan.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class PlanRequest:
    model: ModelSpec
    model_ref: str
    """What the user named the model by (a preset name or a folder): goes in the fleet.yaml."""
    accelerator: Accelerator
    count: int
    """Accelerators per node (on CPU: replicas, each with its own KV space)."""
    nodes: int
    weights_dtype: WeightDtype
    kv_dtype: KvDtype
    traffic: TrafficConfig
    slo: Slo
    max_model_len: int | None = None
    """None: derived from the traffic."""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    enable_chunked_prefill: bool | None = None
    hardware: HardwareConfig | None = None
    """The hardware section the request came from (catalog file, overrides), written back
    into the planned fleet.yaml."""
    block_size: int | None = None
    """None: vLLM's default for the model and device."""
    layout: Parallelism | None = None
    """The layout fleet.yaml's engine section pins (any of its parallel fields set): planned
    as it is, since it is what the replicas run; None: the planner chooses."""
    replicas_per_gpu: int = 1
    """Replicas sharing each group of TP x PP accelerators (hardware.replicas_per_gpu): each
    plans at its own gpu_memory_utilization, and they take 1/replicas_per_gpu of the GPUs."""
    dummy_weights: bool = False
    """model.weights: dummy: random weights from the config alone; the plan's memory is the
    same, its command loads them so (--load-format dummy) and says so."""
    kv_offload: KvOffload | None = None
    """engine.kv_offload_gib: the CPU tier of the KV cache; None: none."""
    cost_model: CostModel | GpuProfile | None = None
    """Step times for the throughput and latency estimates: a calibrated profile, or a GPU
    operator profile (composed per layout); None: the roofline of the model on the
    accelerator."""

    @classmethod
    def from_fleet(
        cls,
        config: FleetConfig,
        cpu_flags: frozenset[str],
        weights_flag: str | None = None,
        kv_flag: str | None = None,
    ) -> PlanRequest:
        """The plan request for a fleet config and the precision flags (which win over it).
        `cpu_flags` are the instruction-set flags of the CPU that would run a CPU replica
        (engine/cpu.py cpu_flags): without native bfloat16, `auto` runs in float32."""
        spec = load_model(config.model.source)
        accelerator = _accelerator(config)
        engine, hw = config.engine, config.hardware
        given = engine.model_fields_set
        cpu = accelerator.kind is AcceleratorKind.CPU
        return cls(
            model=spec,
            model_ref=config.model.source,
            accelerator=accelerator,
            count=config.replicas.count if cpu else hw.count,
            nodes=hw.nodes,
            weights_dtype=_weights_dtype(weights_flag, config, spec, cpu_flags if cpu else None),
            kv_dtype=parse_kv_dtype(kv_flag or engine.kv_cache_dtype),
            traffic=config.traffic,
            slo=config.slo,
            max_model_len=engine.max_model_len if "max_model_len" in given else None,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            gpu_memory_utilization=(
                engine.gpu_memory_utilization if "gpu_memory_utilization" in given else None
            ),
            enable_chunked_prefill=engine.enable_chunked_prefill,
            block_size=engine.block_size,
            hardware=hw,
            layout=_layout(config) if given & _LAYOUT_FIELDS else None,
            replicas_per_gpu=1 if cpu else hw.replicas_per_gpu,
            dummy_weights=config.model.weights is Weights.DUMMY,
            kv_offload=_kv_offload(config),
        )

    @property
    def pinned_hardware(self) -> frozenset[str]:
        """Of `count` and `nodes`, those the user set (a flag or fleet.yaml): the plan keeps
        them, and offers to change them only when nothing else fits."""
        given = set() if self.hardware is None else self.hardware.model_fields_set
        return frozenset(given & {"count", "nodes"})

    def replace(self, **changes: object) -> PlanRequest:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def wanted_model_len(self) -> int:
        """Longest prompt + output of the traffic, rounded up to a multiple of 1,024."""
        t = self.traffic
        longest_in = t.max_input_tokens or 4 * t.input_tokens
        longest_out = t.max_output_tokens or 4 * t.output_tokens
        return -(-(longest_in + longest_out) // 1024) * 1024

    @property
    def mean_request_tokens(self) -> int:
        return self.traffic.input_tokens + self.traffic.output_tokens


_LAYOUT_FIELDS = frozenset(
    {"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
     "enable_expert_parallel"}
)  # fmt: skip


def _layout(config: FleetConfig) -> Parallelism:
    engine = config.engine
    return Parallelism(
        tp=engine.tensor_parallel_size,
        pp=engine.pipeline_parallel_size,
        dp=engine.data_parallel_size,
        expert_parallel=engine.enable_expert_parallel,
    )


def _kv_offload(config: FleetConfig) -> KvOffload | None:
    engine = config.engine
    if engine.kv_offload_gib is None:
        return None
    return KvOffload(engine.kv_offload_gib, engine.kv_offload_backend)


def fleet_vllm_defaults(config: FleetConfig) -> VllmDefaults:
    """What the fleet's vLLM replicas run with when not told: vLLM's defaults on
    hardware.device, at the memory of its accelerator (hardware.memory_gib, else the
    catalog's); one the catalog lacks counts as unknown memory, as vLLM counts a device it
    cannot ask (its smallest defaults)."""
    hw, engine = config.hardware, config.engine
    try:
        accelerator = _accelerator(config)
        memory_gib, name = accelerator.memory_gib, accelerator.name
    except ConfigError:
        memory_gib, name = hw.memory_gib or 0.0, hw.accelerator
    return vllm_defaults(
        hw.device,
        memory_gib,
        device_name=name,
        world_size=engine.tensor_parallel_size * engine.pipeline_parallel_size,
    )


def _accelerator(config: FleetConfig) -> Accelerator:
    hw = config.hardware
    catalog = load_catalog(Path(hw.catalog)) if hw.catalog else None
    accelerator = get_accelerator(hw.accelerator, catalog)
    memory = hw.memory_gib
    if memory is None and accelerator.kind is AcceleratorKind.CPU:
        memory = config.engine.cpu_kv_cache_space_gib
    return with_overrides(accelerator, memory_gib=memory, price_usd_per_hour=hw.price_usd_per_hour)


def _weights_dtype(
    flag: str | None, config: FleetConfig, spec: ModelSpec, cpu_flags: frozenset[str] | None
) -> WeightDtype:
    """`cpu_flags` is None for a GPU replica."""
    engine = config.engine
    if flag is not None:
        return parse_weight_dtype(flag)
    if engine.quantization is not None:
        return quantization_weights(
            engine.quantization, spec.checkpoint_dtype, field="engine.quantization"
        )
    # What the replica will really run: on a CPU without bfloat16, `auto` means float32.
    dtype = (
        engine.dtype if cpu_flags is None else resolve_dtype(engine.dtype, Device.CPU, cpu_flags)
    )
    if dtype != "auto":
        return parse_weight_dtype(dtype, field="engine.dtype")
    return spec.checkpoint_dtype
