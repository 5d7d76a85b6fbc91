"""The simulated replica's command line: vLLM's server flags plus a few of its own.

A simulated replica takes the flags servepilot passes to vLLM (engine/args.py server_args), so
`servepilot up` launches both the same way, and derives from them what vLLM would: the KV
blocks (plan/kv.py kv_cache_shape at --kv-cache-memory-bytes on CPU, or at
--gpu-memory-utilization of the accelerator's memory less weights, activations and runtime on
GPU: the planner's estimate), vLLM 0.32's defaults for the knobs left out, and the step times
(a calibrated profile, explicit coefficients, or the roofline of the model on the accelerator).
vLLM flags the simulator has no use for are accepted and ignored.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import COEFFICIENTS, CostModel, load_profile, roofline_cost_model
from servepilot.plan.dtypes import WeightDtype, parse_kv_dtype, parse_weight_dtype
from servepilot.plan.hardware import (
    Accelerator,
    AcceleratorKind,
    get_accelerator,
    load_catalog,
    with_overrides,
)
from servepilot.plan.knobs import vllm_defaults
from servepilot.plan.kv import KvCacheShape, kv_cache_shape, vllm_default_block_size
from servepilot.plan.memory import device_memory
from servepilot.plan.parallel import Parallelism
from servepilot.plan.presets import load_model
from servepilot.plan.spec import ModelSpec
from servepilot.sim.records import SchedulerConfig

# vLLM-CPU's KV cache space when neither --kv-cache-memory-bytes nor VLLM_CPU_KVCACHE_SPACE
# is given (vllm/platforms/cpu.py).
CPU_DEFAULT_KV_BYTES = 4 * 2**30


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servepilot.sim.server",
        description="A simulated vLLM replica: vLLM's HTTP API and metrics, timed in real "
        "time by servepilot's model of vLLM's scheduler.",
    )
    p.add_argument("--model", required=True, help="a preset name or a Hugging Face folder")
    p.add_argument("--served-model-name", help="the name clients send (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--quantization")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction)
    p.add_argument("--enforce-eager", action="store_true")
    sim = p.add_argument_group("simulator")
    sim.add_argument("--accelerator", default="cpu", help="catalog name (default: cpu)")
    sim.add_argument("--catalog", type=Path, help="a user accelerator catalog (YAML)")
    sim.add_argument("--memory-gib", type=float, help="accelerator memory, overriding the catalog")
    sim.add_argument("--profile", type=Path, help="a cost profile (servepilot.costmodel/v1)")
    sim.add_argument("--step-ms", type=float, help="fixed time of every step, in ms")
    sim.add_argument(
        "--cost", action="append", default=[], metavar="NAME=SECONDS",
        help=f"one cost coefficient ({', '.join(COEFFICIENTS)}); others are 0",
    )  # fmt: skip
    sim.add_argument("--tokenizer", type=Path, help="a Hugging Face folder with tokenizer.json")
    sim.add_argument(
        "--drain-timeout-s", type=float, default=30.0,
        help="on SIGTERM, how long requests in flight may take to finish",
    )  # fmt: skip
    return p


@dataclass(frozen=True, slots=True)
class SimSetup:
    """Everything the server needs, derived from the flags."""

    spec: ModelSpec
    served_name: str
    scheduler: SchedulerConfig
    cost: CostModel
    kv_capacity_tokens: int
    max_concurrency: float
    device_label: str
    """vLLM's name for the KV pool's device in its log: GPU or CPU."""


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The flags, and the vLLM flags the simulator ignores."""
    return build_parser().parse_known_args(argv)


def build_setup(args: argparse.Namespace) -> SimSetup:
    spec = load_model(args.model)
    accelerator = _accelerator(args)
    cpu = accelerator.kind is AcceleratorKind.CPU
    default_batched, default_seqs = vllm_defaults(accelerator)
    model_len = args.max_model_len or spec.max_position_embeddings
    seqs = args.max_num_seqs or default_seqs
    chunked = args.enable_chunked_prefill is not False
    batched = args.max_num_batched_tokens or max(default_batched, seqs)
    if not chunked and args.max_num_batched_tokens is None:
        batched = max(batched, model_len)  # vLLM does the same without chunked prefill
    compute, weights = _dtypes(args, spec)
    tp = args.tensor_parallel_size
    block = args.block_size or vllm_default_block_size(spec.attention, cpu=cpu)
    shape = kv_cache_shape(
        spec, kv_dtype=parse_kv_dtype(args.kv_cache_dtype, field="--kv-cache-dtype"),
        compute_dtype=compute, tp=tp, block_size=block, max_num_batched_tokens=batched,
    )  # fmt: skip
    kv_bytes = _kv_bytes(args, spec, accelerator, weights, batched, seqs)
    _check_fits(shape, kv_bytes, model_len)
    capacity = shape.capacity_tokens(kv_bytes, model_len)
    scheduler = SchedulerConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        max_model_len=model_len,
        block_size=shape.block_size_tokens,
        num_blocks=_num_blocks(shape, kv_bytes, capacity),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=args.enable_prefix_caching is not False,
        async_scheduling=(not cpu) if args.async_scheduling is None else args.async_scheduling,
    )
    return SimSetup(
        spec=spec,
        served_name=args.served_model_name or args.model,
        scheduler=scheduler,
        cost=_cost_model(args, spec, accelerator, weights, shape, tp),
        kv_capacity_tokens=capacity,
        max_concurrency=shape.max_concurrency(kv_bytes, model_len),
        device_label="CPU" if cpu else "GPU",
    )


def _accelerator(args: argparse.Namespace) -> Accelerator:
    catalog = load_catalog(args.catalog) if args.catalog else None
    accelerator = get_accelerator(args.accelerator, catalog)
    if args.memory_gib is not None:
        accelerator = with_overrides(accelerator, memory_gib=args.memory_gib)
    return accelerator


def _dtypes(args: argparse.Namespace, spec: ModelSpec) -> tuple[WeightDtype, WeightDtype]:
    """(compute dtype, weights dtype) as the planner reads them (plan/layout.py Setting)."""
    if args.dtype == "auto":
        weights = spec.checkpoint_dtype
    else:
        weights = parse_weight_dtype(args.dtype, field="--dtype")
    if args.quantization is not None:
        weights = parse_weight_dtype(args.quantization, field="--quantization")
    wide = args.dtype in ("float32", "fp32") or (
        args.dtype == "auto" and weights is WeightDtype.FP32
    )
    return (WeightDtype.FP32 if wide else WeightDtype.BF16), weights


def _kv_bytes(
    args: argparse.Namespace,
    spec: ModelSpec,
    accelerator: Accelerator,
    weights: WeightDtype,
    batched: int,
    seqs: int,
) -> int:
    if accelerator.kind is AcceleratorKind.CPU:
        return args.kv_cache_memory_bytes or CPU_DEFAULT_KV_BYTES
    if args.kv_cache_memory_bytes is not None:
        return int(args.kv_cache_memory_bytes)
    memory = device_memory(
        spec, accelerator, Parallelism(tp=args.tensor_parallel_size),
        weights_dtype=weights, gpu_memory_utilization=args.gpu_memory_utilization,
        batched_tokens=batched, max_num_seqs=seqs, cuda_graphs=not args.enforce_eager,
    )  # fmt: skip
    return max(0, memory.kv_bytes)


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


def _cost_model(
    args: argparse.Namespace,
    spec: ModelSpec,
    accelerator: Accelerator,
    weights: WeightDtype,
    shape: KvCacheShape,
    tp: int,
) -> CostModel:
    if args.profile is not None:
        if args.step_ms is not None or args.cost:
            raise ConfigError("--profile cannot be combined with --step-ms or --cost")
        return load_profile(args.profile)
    if args.step_ms is not None or args.cost:
        return _explicit_cost(args.step_ms, args.cost)
    return roofline_cost_model(
        spec, accelerator, weights_dtype=weights, kv_bytes_per_token=shape.bytes_per_token, tp=tp
    )


def _explicit_cost(step_ms: float | None, pairs: list[str]) -> CostModel:
    values = dict.fromkeys(COEFFICIENTS, 0.0)
    if step_ms is not None:
        values["base_s"] = step_ms / 1000.0
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in values:
            raise ConfigError(
                f"--cost {pair!r}: expected NAME=SECONDS with NAME one of {', '.join(COEFFICIENTS)}"
            )
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise ConfigError(f"--cost {pair!r}: the value must be a number of seconds >= 0")
        values[name] = value
    if not values["base_s"] > 0:
        raise ConfigError("--step-ms or --cost base_s=... must give every step a time above 0")
    return CostModel(source="explicit: command line", **values)
