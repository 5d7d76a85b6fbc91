"""A plan as data: the `--json` object and the fleet.yaml `servepilot up -c` accepts."""

from __future__ import annotations

from typing import Any

from servepilot.core.config import (
    Device,
    EngineConfig,
    FleetConfig,
    HardwareConfig,
    ModelConfig,
    ReplicasConfig,
    Weights,
)
from servepilot.plan.checkpoint import checkpoint_for, needs_quantized_checkpoint
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.estimate import Estimates
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.kv_offload import host_bytes_per_node
from servepilot.plan.layout import Option
from servepilot.plan.planner import Plan

GIB = 2**30
SCHEMA = "servepilot.plan/v1"

_VLLM_DTYPE = {
    WeightDtype.FP32: "float32",
    WeightDtype.BF16: "bfloat16",
    WeightDtype.FP16: "float16",
}


def fleet_config(plan: Plan, given: EngineConfig | None = None) -> FleetConfig:
    """The planned deployment as a fleet config: model, hardware, layout, knobs, replicas;
    `given`: the engine section planned (what the plan does not decide is kept from it)."""
    req = plan.request
    return FleetConfig(
        model=_model(plan),
        hardware=_hardware(plan),
        engine=planned_engine(plan, given or EngineConfig()),
        replicas=ReplicasConfig(count=max(1, plan.option.replicas)),
        slo=req.slo,
        traffic=req.traffic,
    )


def planned_engine(plan: Plan, given: EngineConfig) -> EngineConfig:
    """`given` with what the plan decided: layout, precision and the knobs (which keep the
    values `given` set). Every command servepilot prints or runs for a planned fleet (plan,
    `k8s render`) is built from it, so they run the capacity the plan was sized on."""
    req = plan.request
    par = plan.option.parallelism
    cpu = req.accelerator.kind is AcceleratorKind.CPU
    dtype, quantization = engine_precision(plan)
    knobs = plan.knobs
    decided: dict[str, object] = {
        "tensor_parallel_size": par.tp,
        "pipeline_parallel_size": par.pp,
        "data_parallel_size": par.dp,
        "enable_expert_parallel": par.expert_parallel,
        "max_model_len": int(knobs.max_model_len.value or 0),
        "max_num_seqs": int(knobs.max_num_seqs.value or 1),
        "max_num_batched_tokens": int(knobs.max_num_batched_tokens.value or 0),
        "enable_chunked_prefill": bool(knobs.enable_chunked_prefill.value),
        "dtype": dtype,
        "quantization": quantization,
        "kv_cache_dtype": req.kv_dtype.vllm_flag,
        "block_size": req.block_size,
        "enforce_eager": given.enforce_eager_on(Device.CPU if cpu else Device.GPU),
    }
    if cpu:
        decided["cpu_kv_cache_space_gib"] = req.accelerator.memory_bytes / GIB
    else:
        decided["gpu_memory_utilization"] = float(knobs.gpu_memory_utilization.value or 0.9)
    # Validated again: the knobs together must make an engine section vLLM accepts.
    return EngineConfig.model_validate(given.model_dump() | decided)


def _model(plan: Plan) -> ModelConfig:
    """The checkpoint the plan serves: the model as named, or, for weights vLLM cannot quantize
    as it loads them, the checkpoint in that format (a repository a preset knows, or the
    placeholder of one to make), which `plan` reads back as the model in that format."""
    req = plan.request
    weights = Weights.DUMMY if req.dummy_weights else Weights.REAL
    if not needs_quantized_checkpoint(req.model, req.weights_dtype):
        return ModelConfig(source=req.model_ref, weights=weights)
    checkpoint = checkpoint_for(req.model, req.model_ref, req.weights_dtype)
    return ModelConfig(source=checkpoint.model, served_name=req.model.name, weights=weights)


def _hardware(plan: Plan) -> HardwareConfig:
    req = plan.request
    cpu = req.accelerator.kind is AcceleratorKind.CPU
    given = req.hardware or HardwareConfig()
    return HardwareConfig(
        device=Device.CPU if cpu else Device.GPU,
        accelerator=req.accelerator.name,
        count=req.count if not cpu else 1,
        nodes=req.nodes,
        # On CPU the memory is the KV space, written as engine.cpu_kv_cache_space_gib.
        memory_gib=None if cpu else given.memory_gib,
        catalog=given.catalog,
        price_usd_per_hour=given.price_usd_per_hour,
        replicas_per_gpu=req.replicas_per_gpu,
    )


def engine_precision(plan: Plan) -> tuple[str, str | None]:
    """(--dtype, --quantization) that load the weights in the planned format: the flag only
    where vLLM quantizes as it loads (fp8); a checkpoint already quantized (the published one,
    or the one `checkpoint_for` names) carries its method in its config.json."""
    req = plan.request
    wanted, published = req.weights_dtype, req.model.checkpoint_dtype
    if wanted in _VLLM_DTYPE:
        if wanted == published and req.accelerator.kind is AcceleratorKind.GPU:
            return "auto", None
        return _VLLM_DTYPE[wanted], None
    if wanted == published or needs_quantized_checkpoint(req.model, wanted):
        return "auto", None
    return "auto", wanted.vllm_quantization


def fleet_yaml(plan: Plan, given: EngineConfig | None = None) -> str:
    import yaml

    data = fleet_config(plan, given).model_dump(mode="json", exclude_defaults=True)
    header = (
        f"# fleet.yaml written by `servepilot plan` for {plan.request.model.name} on "
        f"{plan.request.nodes} x {plan.request.count} {plan.request.accelerator.name}\n"
    )
    req = plan.request
    checkpoint = checkpoint_for(req.model, req.model_ref, req.weights_dtype)
    if checkpoint.is_placeholder:
        header += (
            f"# model.source is a checkpoint to make: {checkpoint.note}; then set model.source "
            "to its folder before `servepilot up`\n"
        )
    elif req.model.repo_id is not None:
        quantized = needs_quantized_checkpoint(req.model, req.weights_dtype)
        what = "a published checkpoint" if quantized else "a preset"
        header += (
            f"# model.source names {what}: download {checkpoint.model} and set model.source to "
            "its folder before `servepilot up`\n"
        )
    return header + yaml.safe_dump(data, sort_keys=False)


def plan_json(plan: Plan) -> dict[str, Any]:
    """The `--json` object (schema servepilot.plan/v1); `vllm_command` is added by the CLI,
    which owns the rendering of engine flags."""
    req = plan.request
    option = plan.option
    return {
        "schema": SCHEMA,
        "fits": plan.fits,
        "model": {
            "name": req.model.name,
            "source": req.model.source,
            "params_total": req.model.params_total,
            "attention": req.model.attention.value,
        },
        "accelerator": {
            "name": req.accelerator.name,
            "count": req.count,
            "nodes": req.nodes,
            "memory_bytes": req.accelerator.memory_bytes,
            "price_usd_per_hour": req.accelerator.price_usd_per_hour,
        },
        "weights_dtype": req.weights_dtype.value,
        "kv_dtype": req.kv_dtype.value,
        "kv_bytes_per_token": option.kv.bytes_per_token,
        "kv_formula": option.kv.formula,
        "kv_capacity_tokens": option.kv_capacity_tokens,
        "kv_cpu_tokens": option.kv_cpu_tokens,
        "kv_offload": _kv_offload(plan),
        "max_concurrency": round(option.max_concurrency, 2),
        "weights_bytes_per_device": option.memory.weights_bytes,
        "memory_per_device": _memory(option),
        "shortfall_bytes": plan.shortfall_bytes,
        "layout": _layout(option, plan.assessment.reason),
        "alternatives": [
            _layout(o, "") | {"fits": o.fits, "kv_capacity_tokens": o.kv_capacity_tokens}
            for o in plan.assessment.options
            if o is not option
        ],
        "knobs": {
            name: {"value": knob.value, "reason": knob.reason}
            for name, knob in plan.knobs.as_dict().items()
        },
        "ladder": _ladder(plan),
        "advice": {
            "deployment": plan.advice.deployment.value,
            "reasons": list(plan.advice.reasons),
            "warnings": list(plan.advice.warnings),
        },
        "cost": _cost(plan),
        "estimates": _estimates(plan.estimates),
    }


def _memory(option: Option) -> dict[str, int]:
    mem = option.memory
    return {
        "total_bytes": mem.total_bytes,
        "usable_bytes": mem.usable_bytes,
        "weights_bytes": mem.weights_bytes,
        "activation_bytes": mem.activation_bytes,
        "runtime_bytes": mem.runtime_bytes,
        "kv_bytes": mem.kv_bytes,
        "headroom_bytes": mem.headroom_bytes,
    }


def _ladder(plan: Plan) -> list[dict[str, Any]]:
    return [
        {
            "action": step.action,
            "fits": step.fits,
            "layout": step.layout,
            "weights_bytes_per_device": step.weights_per_rank_bytes,
            "kv_capacity_tokens": step.kv_capacity_tokens,
            "max_concurrency": round(step.max_concurrency, 2),
        }
        for step in plan.ladder
    ]


def _cost(plan: Plan) -> dict[str, Any]:
    cost = plan.cost
    return {
        "usd_per_hour": round(cost.usd_per_hour, 4),
        "nodes_for_target": cost.nodes_for_target,
        "usd_per_hour_for_target": _round(cost.usd_per_hour_for_target),
        "usd_per_qps": _round(cost.usd_per_qps),
        "usd_per_million_output_tokens": _round(cost.usd_per_million_output_tokens),
        "over_qps_line": cost.over_qps_line,
        "basis": cost.basis,
    }


def _estimates(found: Estimates | None) -> dict[str, Any] | None:
    """In bench's units: a plan can be held against `servepilot bench` or `sim`."""
    if found is None:
        return None
    return {
        "source": found.source,
        "limit": found.limit.value,
        "replicas": found.replicas,
        "replicas_for_target": found.replicas_for_target,
        "fleet_output_throughput": round(found.fleet_output_tokens_per_s, 2),
        "fleet_request_throughput": round(found.fleet_requests_per_s, 4),
        "per_replica": {
            name: {
                "concurrency": round(point.concurrency, 2),
                "step_ms": round(point.step_ms, 3),
                "ttft_ms": round(point.ttft_ms, 3),
                "tpot_ms": round(point.tpot_ms, 3),
                "output_throughput": round(point.output_tokens_per_s, 2),
                "request_throughput": round(point.requests_per_s, 4),
            }
            for name, point in (("idle", found.idle), ("capacity", found.capacity))
        },
        "note": "steady state at the traffic's mean lengths without queueing (TTFT at "
        "capacity is one step carrying the prefill); `servepilot sim` predicts queues and "
        "bursts, `servepilot bench` measures",
    }


def _kv_offload(plan: Plan) -> dict[str, Any] | None:
    """The CPU tier as asked and what it pins per node (at startup); None when off."""
    offload, option = plan.request.kv_offload, plan.option
    if offload is None:
        return None
    par = option.parallelism
    return {
        "size_gib": offload.size_gib,
        "backend": offload.backend.value,
        "host_bytes_per_replica": offload.replica_bytes(par),
        "host_bytes_per_node": host_bytes_per_node(
            offload, par, option.replicas, plan.request.nodes
        ),
    }


def _layout(option: Option, reason: str) -> dict[str, Any]:
    par = option.parallelism
    return {
        "tp": par.tp,
        "ep": par.ep,
        "dp": par.dp,
        "pp": par.pp,
        "name": par.describe(),
        "devices_per_replica": par.devices,
        "replicas_per_gpu": option.replicas_per_device,
        "replicas": option.replicas,
        "reason": reason,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
