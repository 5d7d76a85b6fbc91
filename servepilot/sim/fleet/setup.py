"""From fleet.yaml to the simulated fleet: each replica's scheduler, KV blocks and step times.

The replicas are what `servepilot up` would launch from the same file: vLLM's knobs as
configured, vLLM 0.32's defaults for those left out, and the KV cache vLLM would allocate
(on CPU exactly `engine.cpu_kv_cache_space_gib`, on GPU the planner's estimate of what is
left at `gpu_memory_utilization`), derived as a simulated replica derives them from its
flags (sim/engine/setup.py). Step times come from a calibrated profile (`--profile`, schema
servepilot.costmodel/v1) or else from the planner's roofline of the model on the
accelerator. The gateway gives each replica the concurrency budget `up` gives it
(routing/admission/budget.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.core.config import EngineKind, FleetConfig, ScalingPolicyName, parse_bounds
from servepilot.core.errors import ConfigError
from servepilot.core.units import parse_duration_s
from servepilot.plan.costmodel import COEFFICIENTS, CostModel, roofline_cost_model
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.gpu_profile.compose import Operating
from servepilot.plan.gpu_profile.source import profile_cost_model, read_step_source
from servepilot.plan.gpu_profile.table import GpuProfile
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.kv import KvCacheShape
from servepilot.plan.request import PlanRequest, fleet_vllm_defaults
from servepilot.plan.step_latency import StepLatency
from servepilot.routing.admission.budget import replica_capacity
from servepilot.scaling.oracle import OracleSetup
from servepilot.scaling.policies import AutoscaleSetup
from servepilot.sim.engine.records import SchedulerConfig
from servepilot.sim.engine.setup import EngineKnobs, EngineSetup, Precision, engine_setup
from servepilot.sim.fleet.network import NetworkConfig
from servepilot.sim.fleet.records import FleetSpec


@dataclass(frozen=True, slots=True)
class ReplicaSetup:
    """One simulated replica, and where each of its numbers came from."""

    scheduler: SchedulerConfig
    cost: CostModel
    cost_kind: str
    """"profile" (calibrated), "gpu profile" (composed from measured operators) or
    "roofline"."""
    capacity: int
    kv_bytes: int
    kv_capacity_tokens: int
    prompt_overhead_tokens: int
    """Tokens the server adds on top of every prompt's --input-tokens, from the profile's
    meta: a BOS token on completions; 0 on chat, where bench sizes the text so the template
    is part of --input-tokens (`chat_template_tokens`)."""
    request_overhead_s: float
    """A request's time outside the engine's steps (HTTP, API server, detokenizing), as
    calibrate measured it; 0 without a profile."""
    replicas_per_node: int
    model_name: str
    notes: tuple[str, ...] = ()
    chat_template_tokens: int = 0
    """A chat profile's template tokens: inside --input-tokens, not added to it."""
    from_profile: bool = False
    """Step times and overheads came from a --profile (calibrated or GPU-profiled)."""
    intake_s_per_prompt_token: float = 0.0
    """What the API server adds per prompt token before the engine sees the request
    (tokenising): the profile's meta `intake_us_per_prompt_token`; 0 without one."""
    output_s_per_token: float = 0.0
    """What the API server spends on each token it streams: the profile's meta
    `output_us_per_token`; 0 without one."""


def replica_setup(
    config: FleetConfig, profile: Path | None, cpu_flags: frozenset[str]
) -> ReplicaSetup:
    """`cpu_flags`: the instruction-set flags of the CPU a CPU replica would run on
    (engine/cpu.py), which decide its float precision."""
    request = PlanRequest.from_fleet(config, cpu_flags)
    engine = config.engine
    if engine.data_parallel_size > 1:
        raise ConfigError(
            "engine.data_parallel_size > 1 is not simulated yet (each DP rank is its own "
            "scheduler and KV pool)",
            hint="simulate the DP ranks as replicas: replicas.count x data_parallel_size",
        )
    setup = _engine(config, request)
    scheduler, shape = setup.scheduler, setup.shape
    notes: list[str] = []
    if len(shape.groups) > 1:
        notes.append(
            f"{request.model.name} has {len(shape.groups)} KV cache groups; the simulator "
            "models one group of full-attention blocks holding the tokens vLLM reports"
        )
    shared = request.replicas_per_gpu
    if shared > 1:
        notes.append(
            f"{shared} replicas share each GPU (hardware.replicas_per_gpu): each simulated "
            "replica gets its own memory share but steps at the GPU's full speed; on the GPU "
            "busy replicas take turns, so each carries about 1/"
            f"{shared} of what it carries here (`servepilot plan` counts that)"
        )
    tp = engine.tensor_parallel_size
    graphs = not engine.enforce_eager_on(config.hardware.device)
    cost, kind, overhead = _cost(request, shape, scheduler, tp, profile, notes, graphs)
    if profile is None and (
        mismatch := request.accelerator.host_mismatch(request.weights_dtype, cpu_flags)
    ):
        notes.append(mismatch)
    meta = _meta(profile) if profile is not None else {}
    # bench takes a chat template off each message's text (bench.chat_template): the
    # server then counts --input-tokens, and so does the simulation.
    template = overhead if meta.get("endpoint") == "chat" else 0
    devices = engine.tensor_parallel_size * engine.pipeline_parallel_size
    cpu = request.accelerator.kind is AcceleratorKind.CPU
    return ReplicaSetup(
        scheduler=scheduler,
        cost=cost,
        cost_kind=kind,
        capacity=replica_capacity(config, fleet_vllm_defaults(config), setup.kv_capacity_tokens),
        kv_bytes=setup.kv_bytes,
        kv_capacity_tokens=setup.kv_capacity_tokens,
        prompt_overhead_tokens=overhead - template,
        chat_template_tokens=template,
        request_overhead_s=_request_overhead_s(meta, profile),
        intake_s_per_prompt_token=_meta_number(meta, "intake_us_per_prompt_token", profile) / 1e6,
        output_s_per_token=_meta_number(meta, "output_us_per_token", profile) / 1e6,
        replicas_per_node=max(
            1,
            config.replicas.count
            if cpu
            else config.hardware.count // devices * config.hardware.replicas_per_gpu,
        ),
        model_name=config.model.served_name or request.model.name,
        notes=tuple(notes),
        from_profile=profile is not None,
    )


def fleet_step_model(config: FleetConfig, cpu_flags: frozenset[str]) -> StepLatency:
    """The step times predicted_latency routes the fleet `up` launches by: the ones a
    simulated replica of the same fleet.yaml steps with, from gateway.routing.step_profile
    (else engine.sim_profile for simulated replicas, else the roofline)."""
    routing, engine = config.gateway.routing, config.engine
    profile = routing.step_profile
    if profile is None and engine.kind is EngineKind.SIM:
        profile = engine.sim_profile
    setup = replica_setup(config, Path(profile) if profile else None, cpu_flags)
    return StepLatency(setup.cost, setup.scheduler.max_num_batched_tokens)


def fleet_spec(
    config: FleetConfig, setup: ReplicaSetup, *, network: NetworkConfig, seed: int
) -> FleetSpec:
    """fleet.yaml's replicas, each one `setup`, behind its gateway (timings at their defaults)."""
    return FleetSpec(
        scheduler=setup.scheduler,
        cost=setup.cost,
        replicas=config.replicas.count,
        capacity=setup.capacity,
        gateway=config.gateway,
        network=network,
        kv_events=config.engine.kv_events,
        intake_s_per_prompt_token=setup.intake_s_per_prompt_token,
        output_s_per_token=setup.output_s_per_token,
        seed=seed,
        model_name=setup.model_name,
    )


def _engine(config: FleetConfig, request: PlanRequest) -> EngineSetup:
    """What the replica `up` launches from this file derives: the knobs engine/args.py
    passes vLLM (server_args), in the precision the planner reads from the file."""
    engine = config.engine
    cpu = request.accelerator.kind is AcceleratorKind.CPU
    knobs = EngineKnobs(
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        block_size=engine.block_size,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        enable_prefix_caching=engine.enable_prefix_caching,
        tensor_parallel_size=engine.tensor_parallel_size,
        pipeline_parallel_size=engine.pipeline_parallel_size,
        enable_expert_parallel=engine.enable_expert_parallel,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        kv_cache_memory_bytes=engine.cpu_kv_cache_bytes if cpu else None,
        enforce_eager=engine.enforce_eager_on(config.hardware.device),
    )
    weights = request.weights_dtype
    compute = WeightDtype.FP32 if weights is WeightDtype.FP32 else WeightDtype.BF16
    precision = Precision(weights=weights, compute=compute, kv=request.kv_dtype)
    return engine_setup(request.model, request.accelerator, knobs, precision)


def _cost(
    request: PlanRequest,
    shape: KvCacheShape,
    scheduler: SchedulerConfig,
    tp: int,
    profile: Path | None,
    notes: list[str],
    cuda_graphs: bool,
) -> tuple[CostModel, str, int]:
    if profile is not None:
        source = read_step_source(profile)
        if isinstance(source, GpuProfile):
            cost = _gpu_cost(request, scheduler, tp, source, notes, cuda_graphs)
            return cost, "gpu profile", 0
        return source, "profile", _overhead(_meta(profile), profile)
    model = roofline_cost_model(
        request.model,
        request.accelerator,
        weights_dtype=request.weights_dtype,
        kv_bytes_per_token=shape.bytes_per_token,
        tp=tp,
    )
    ceilings = "measured" if request.accelerator.measured_source else "datasheet"
    notes.append(
        f"roofline step times: an estimate from the accelerator's {ceilings} ceilings; "
        "for accuracy, profile the GPU (`servepilot profile`) or calibrate a replica"
    )
    return model, "roofline", 0


def _gpu_cost(
    request: PlanRequest,
    scheduler: SchedulerConfig,
    tp: int,
    profile: GpuProfile,
    notes: list[str],
    cuda_graphs: bool,
) -> CostModel:
    traffic = request.traffic
    at = Operating(
        traffic.input_tokens,
        traffic.output_tokens,
        scheduler.max_num_seqs,
        scheduler.max_num_batched_tokens,
        max_context_tokens=scheduler.max_model_len,
        cuda_graphs=cuda_graphs,
    )
    fitted = profile_cost_model(
        profile, request.model, request.accelerator, tp=tp, weights=request.weights_dtype, at=at
    )
    notes.append(
        f"step times composed from {profile.source} ({profile.versions}), linearized around "
        f"the traffic: median error {fitted.median_error:.1%}, at most {fitted.max_error:.1%}; "
        "TP all-reduces from the catalog's link figures (not measured)"
    )
    return fitted.model


def _meta(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text(encoding="utf-8"))  # load_profile checked it
    meta = document.get("meta", {})
    return meta if isinstance(meta, dict) else {}


def _request_overhead_s(meta: dict[str, Any], path: Path | None) -> float:
    return _meta_number(meta, "request_overhead_ms", path) / 1000.0


def _meta_number(meta: dict[str, Any], key: str, path: Path | None) -> float:
    value = meta.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{path}: meta.{key}: expected a number >= 0, got {value!r}")
    return float(value)


def _overhead(meta: dict[str, Any], path: Path) -> int:
    value = meta.get("prompt_overhead_tokens", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"{path}: meta.prompt_overhead_tokens: expected a whole number >= 0, got {value!r}"
        )
    return value


def autoscaler(
    text: str | None,
    policy: str = "target",
    target: float = 0.7,
    replica_rps: float | None = None,
    horizon: str | None = None,
    spec: FleetSpec | None = None,
) -> AutoscaleSetup | OracleSetup | None:
    """The --autoscale MIN:MAX flag and the policy's own (--scaling-policy, --autoscale-target,
    --replica-rps, --forecast-horizon, by default the cold start plus one interval of `spec`;
    with a warm pool, the wake plus one too)
    -> what builds the simulated fleet's autoscaling policy; None without --autoscale.
    "oracle" (sim only: told the level's schedule) sizes with --replica-rps as predictive."""
    if not text:
        return None
    lo, hi = parse_bounds(text)
    if replica_rps is not None and replica_rps <= 0:
        raise ConfigError(f"--replica-rps must be > 0, got {replica_rps}")
    tick_s = spec.autoscale_interval_s if spec is not None else 0.0
    # Told (or forecasting) the future, it starts cold a cold start ahead what its pool
    # cannot wake, and leaves the rest to the pool's wake.
    cold_s = spec.cold_start_s + tick_s if spec is not None else 0.0
    if horizon:
        cold_s = parse_duration_s(horizon, "--forecast-horizon")
    pool = spec.warm_pool if spec is not None else 0
    wake_s = min(cold_s, spec.wake_s + tick_s) if spec is not None and pool else None
    if policy == ORACLE:
        return OracleSetup(lo, hi, replica_rps or 0.0, cold_s, pool=pool, wake_horizon_s=wake_s)
    return AutoscaleSetup(ScalingPolicyName(policy), lo, hi, target, replica_rps, cold_s,
                          pool=pool, wake_horizon_s=wake_s)  # fmt: skip


ORACLE = "oracle"
"""`sim --scaling-policy oracle`: not a ScalingPolicyName, since no real fleet (fleet.yaml,
`up`) knows its future."""


def target_section(
    config: FleetConfig,
    setup: ReplicaSetup,
    spec: FleetSpec,
    profile: Path | None,
    scaling: AutoscaleSetup | OracleSetup | None = None,
) -> dict[str, Any]:
    """The results file's "target" section: the simulated fleet, and where its numbers came
    from (its autoscaling policy too, when it has one)."""
    s, net, engine = setup.scheduler, spec.network, config.engine
    return {
        "simulator": "servepilot.sim",
        "model": setup.model_name,
        "accelerator": config.hardware.accelerator,
        "replicas": spec.replicas,
        "replicas_per_node": net.replicas_per_node,
        "policy": config.gateway.policy.value,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "scheduler": {
            "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
            "max_model_len": s.max_model_len, "block_size": s.block_size,
            "num_blocks": s.num_blocks, "kv_capacity_tokens": setup.kv_capacity_tokens,
            "enable_chunked_prefill": s.enable_chunked_prefill,
            "enable_prefix_caching": s.enable_prefix_caching,
            "async_scheduling": s.async_scheduling,
        },
        "replica_capacity": spec.capacity,
        "cost_model": {
            "kind": setup.cost_kind, "source": spec.cost.source,
            "profile": str(profile) if profile is not None else None,
            "coefficients": dict(zip(COEFFICIENTS, spec.cost.coefficients, strict=True)),
        },
        "prompt_overhead_tokens": setup.prompt_overhead_tokens,
        "chat_template_tokens": setup.chat_template_tokens,
        "network_ms": {
            "client": net.client_gateway_s * 1e3,
            "same_node": [net.same_node.low_s * 1e3, net.same_node.high_s * 1e3],
            "cross_node": [net.cross_node.low_s * 1e3, net.cross_node.high_s * 1e3],
        },
        "scrape_interval_s": spec.scrape_interval_s or config.gateway.health_interval_s,
        "cold_start_s": spec.cold_start_s,
        "warm_pool": {"replicas": spec.warm_pool, "wake_s": spec.wake_s, "sleep_s": spec.sleep_s,
                      "refill": "cold" if spec.cold_refill else "sleep"},
    } | ({"autoscale": scaling.describe()} if scaling is not None else {})  # fmt: skip
