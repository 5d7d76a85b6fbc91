"""The simulated replica's command line: vLLM's server flags plus a few of its own.

A simulated replica takes the flags servepilot passes to vLLM (engine/args.py server_args), so
`servepilot up` launches both the same way, and derives from them what vLLM would: the
scheduler's limits and KV blocks (engine_setup.py, the derivation `servepilot sim` makes from
fleet.yaml) and the step times (a calibrated profile, explicit coefficients, or the roofline
of the model on the accelerator). vLLM flags the simulator has no use for are accepted and
ignored.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from servepilot.core.config import DEFAULT_GPU_MEMORY_UTILIZATION
from servepilot.core.errors import ConfigError
from servepilot.engine.simserver.kvconfig import KvEventsConfig, parse_kv_events_config
from servepilot.plan.costmodel import COEFFICIENTS, CostModel, roofline_cost_model
from servepilot.plan.costprofile import load_profile
from servepilot.plan.dtypes import (
    WeightDtype,
    parse_kv_dtype,
    parse_weight_dtype,
    quantization_weights,
)
from servepilot.plan.hardware import (
    Accelerator,
    AcceleratorKind,
    get_accelerator,
    load_catalog,
    with_overrides,
)
from servepilot.plan.kv import KvCacheShape
from servepilot.plan.presets import load_model
from servepilot.plan.spec import ModelSpec
from servepilot.routing.kv_index import SUPPORTED_ALGOS
from servepilot.sim.engine.records import SchedulerConfig
from servepilot.sim.engine.setup import EngineKnobs, Precision, engine_setup


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servepilot.engine.simserver.server",
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
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument(
        "--kv-events-config", metavar="JSON",
        help="publish KV cache events as vLLM does (its KVEventsConfig as JSON), and say "
        "where in GET /kv_event_sources",
    )  # fmt: skip
    p.add_argument(
        "--prefix-caching-hash-algo", default="sha256",
        help="how blocks are hashed (vLLM's default, sha256, is the one simulated)",
    )  # fmt: skip
    p.add_argument(
        "--enable-sleep-mode", action="store_true",
        help="serve POST /sleep, POST /wake_up and GET /is_sleeping (vLLM serves them with "
        "this flag and VLLM_SERVER_DEV_MODE=1)",
    )  # fmt: skip
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
    # Defaults: Llama-3.1-8B on an H200 (the first sleep pins the host buffers).
    sim.add_argument("--first-sleep-s", type=float, default=11.6,
                     help="how long the first sleep takes (default 11.6)")  # fmt: skip
    sim.add_argument("--sleep-s", type=float, default=0.4,
                     help="how long each later sleep takes (default 0.4)")  # fmt: skip
    sim.add_argument("--wake-s", type=float, default=0.8,
                     help="how long waking the weights takes (default 0.8)")  # fmt: skip
    sim.add_argument(
        "--drop-streams-after-tokens", type=int, metavar="K",
        help="a fault for tests: cut the connection of every streamed answer after its K-th "
        "token, as a replica that dies mid-answer does (default: never)",
    )  # fmt: skip
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
    kv_events: KvEventsConfig = field(default_factory=KvEventsConfig)
    """--kv-events-config: where its KV events are published, if they are."""


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The flags, and the vLLM flags the simulator ignores."""
    return build_parser().parse_known_args(argv)


def build_setup(args: argparse.Namespace) -> SimSetup:
    spec = load_model(args.model)
    accelerator = _accelerator(args)
    compute, weights = _dtypes(args, spec)
    kv_dtype = parse_kv_dtype(args.kv_cache_dtype, field="--kv-cache-dtype")
    engine = engine_setup(spec, accelerator, _knobs(args), Precision(weights, compute, kv_dtype))
    model_len = engine.scheduler.max_model_len
    if args.prefix_caching_hash_algo not in SUPPORTED_ALGOS:
        raise ConfigError(
            f"--prefix-caching-hash-algo {args.prefix_caching_hash_algo}: the simulated replica "
            f"hashes blocks with {', '.join(SUPPORTED_ALGOS)} only (vLLM's default)"
        )
    return SimSetup(
        spec=spec,
        served_name=args.served_model_name or args.model,
        scheduler=engine.scheduler,
        cost=_cost_model(args, spec, accelerator, weights, engine.shape),
        kv_capacity_tokens=engine.kv_capacity_tokens,
        max_concurrency=engine.shape.max_concurrency(engine.kv_bytes, model_len),
        device_label="CPU" if accelerator.kind is AcceleratorKind.CPU else "GPU",
        kv_events=parse_kv_events_config(args.kv_events_config),
    )


def _knobs(args: argparse.Namespace) -> EngineKnobs:
    return EngineKnobs(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching,
        async_scheduling=args.async_scheduling,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        enforce_eager=args.enforce_eager,
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
        weights = quantization_weights(
            args.quantization, spec.checkpoint_dtype, field="--quantization"
        )
    wide = args.dtype in ("float32", "fp32") or (
        args.dtype == "auto" and weights is WeightDtype.FP32
    )
    return (WeightDtype.FP32 if wide else WeightDtype.BF16), weights


def _cost_model(
    args: argparse.Namespace,
    spec: ModelSpec,
    accelerator: Accelerator,
    weights: WeightDtype,
    shape: KvCacheShape,
) -> CostModel:
    if args.profile is not None:
        if args.step_ms is not None or args.cost:
            raise ConfigError("--profile cannot be combined with --step-ms or --cost")
        return load_profile(args.profile)
    if args.step_ms is not None or args.cost:
        return _explicit_cost(args.step_ms, args.cost)
    return roofline_cost_model(
        spec,
        accelerator,
        weights_dtype=weights,
        kv_bytes_per_token=shape.bytes_per_token,
        tp=args.tensor_parallel_size,
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
    return CostModel.of(values, source="explicit: command line")
