"""The search space the planner allows, and the fleet config of any point in it.

The starting point is the planner's configuration for the fleet and the workload's traffic
(or, when that does not fit, the first rung of its ladder that does). Each knob gets a ladder
around it; `check` asks the planner whether a point fits (weights, activations and one
request of max_model_len in the KV cache, per layout) and refuses what vLLM refuses
(max_num_batched_tokens below max_num_seqs) or what the workload cannot use (a
max_model_len shorter than its longest request).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from servepilot.core.config import FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.plan.checkpoint import checkpoint_for
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.hardware import AcceleratorKind, with_overrides
from servepilot.plan.planner import Plan, assess, make_plan
from servepilot.plan.request import PlanRequest
from servepilot.tune.space import Axis, Check, Knob, SearchSpace, TrialConfig, Value, ladder

GB = 1e9
_GPU_UTILIZATIONS = (0.8, 0.85, 0.9, 0.95)
_SEQS_CAP = {AcceleratorKind.CPU: 512, AcceleratorKind.GPU: 1024}
_BATCHED_RANGE = {AcceleratorKind.CPU: (128, 8192), AcceleratorKind.GPU: (256, 16384)}


@dataclass(frozen=True, slots=True)
class PlanSpace:
    space: SearchSpace
    base: FleetConfig
    """The fleet config a trial's knobs are applied to."""
    devices: int
    """Accelerators of the whole fleet (GPU), split between TP and replicas."""
    pipeline_parallel_size: int
    base_weights: WeightDtype
    """The weights `base` runs with no engine.quantization override."""

    def fleet(self, trial: TrialConfig) -> FleetConfig:
        """The fleet config that runs `trial`."""
        overrides: dict[str, object] = {
            "engine.max_num_seqs": trial.get(Knob.MAX_NUM_SEQS),
            "engine.max_num_batched_tokens": trial.get(Knob.MAX_NUM_BATCHED_TOKENS),
            "engine.max_model_len": trial.get(Knob.MAX_MODEL_LEN),
            "engine.kv_cache_dtype": KvDtype(str(trial.get(Knob.KV_CACHE_DTYPE))).vllm_flag,
        }
        if trial.has(Knob.CPU_KV_CACHE_SPACE_GIB):
            overrides["engine.cpu_kv_cache_space_gib"] = trial.get(Knob.CPU_KV_CACHE_SPACE_GIB)
        if trial.has(Knob.GPU_MEMORY_UTILIZATION):
            tp = int(trial.get(Knob.TENSOR_PARALLEL_SIZE))
            overrides["engine.gpu_memory_utilization"] = trial.get(Knob.GPU_MEMORY_UTILIZATION)
            overrides["engine.tensor_parallel_size"] = tp
            per_gpu = self.base.hardware.replicas_per_gpu
            groups = self.devices // (tp * self.pipeline_parallel_size)
            overrides["replicas.count"] = max(1, groups * per_gpu)
        weights = WeightDtype(str(trial.get(Knob.WEIGHTS_DTYPE)))
        if weights is not self.base_weights:
            # Only online formats get here: build_space refuses a start that needs another
            # checkpoint, and the weights axis adds fp8 alone.
            overrides["engine.quantization"] = weights.vllm_quantization
        return self.base.with_overrides(overrides)


def build_space(
    config: FleetConfig,
    request: PlanRequest,
    *,
    longest_request_tokens: int,
    knobs: frozenset[Knob] | None = None,
    cpu_fp8_kv: bool = False,
) -> PlanSpace:
    """`request`: the planner's request for `config` with the workload's traffic.
    `knobs`: the knobs to search (None: all); the others stay at the planner's values."""
    plan = _runnable(make_plan(request))
    req = plan.request
    _check_servable(req, request)
    cpu = req.accelerator.kind is AcceleratorKind.CPU
    default = _default(plan, config, cpu)
    axes, notes = _axes(plan, default, longest_request_tokens, cpu, cpu_fp8_kv)
    if knobs is not None:
        left_out = [a.knob.value for a in axes if a.knob not in knobs]
        axes = tuple(a for a in axes if a.knob in knobs)
        if left_out:
            notes += (f"held at the planner's values (--knobs): {', '.join(left_out)}",)
    check = _checker(req, longest_request_tokens, plan.option.parallelism.pp)
    space = SearchSpace(axes=axes, default=default, check=check, notes=notes)
    devices = config.hardware.count * config.hardware.nodes
    return PlanSpace(space, config, devices, plan.option.parallelism.pp, request.weights_dtype)


def _check_servable(req: PlanRequest, configured: PlanRequest) -> None:
    """Tune runs the configured checkpoint: a start (the ladder's first fitting rung) in a
    format vLLM cannot quantize to as it loads it needs another checkpoint first."""
    weights = req.weights_dtype
    if weights is configured.weights_dtype or weights.vllm_quantization is not None:
        return
    found = checkpoint_for(req.model, req.model_ref, weights)
    raise ConfigError(
        f"{req.model.name} fits {configured.count} {req.accelerator.name} only with "
        f"{weights.value} weights, which vLLM cannot make from the configured checkpoint",
        hint=f"set model.source to a {weights.value} checkpoint ({found.model}; its "
        "config.json carries the format) or add accelerators, then tune again",
    )


def _runnable(plan: Plan) -> Plan:
    step = None if plan.fits else plan.first_fitting_step
    return plan if step is None else make_plan(step.request)


def _default(plan: Plan, config: FleetConfig, cpu: bool) -> TrialConfig:
    knobs, req = plan.knobs, plan.request
    values: dict[Knob, Value] = {
        Knob.MAX_NUM_SEQS: int(knobs.max_num_seqs.value or 1),
        Knob.MAX_NUM_BATCHED_TOKENS: int(knobs.max_num_batched_tokens.value or 1),
        Knob.MAX_MODEL_LEN: int(knobs.max_model_len.value or 1),
        Knob.KV_CACHE_DTYPE: req.kv_dtype.value,
        Knob.WEIGHTS_DTYPE: req.weights_dtype.value,
    }
    if cpu:
        values[Knob.CPU_KV_CACHE_SPACE_GIB] = float(req.accelerator.memory_gib)
    else:
        values[Knob.GPU_MEMORY_UTILIZATION] = float(knobs.gpu_memory_utilization.value or 0.9)
        values[Knob.TENSOR_PARALLEL_SIZE] = plan.option.parallelism.tp
    return TrialConfig.of(values)


def _axes(
    plan: Plan, default: TrialConfig, longest: int, cpu: bool, cpu_fp8_kv: bool
) -> tuple[tuple[Axis, ...], tuple[str, ...]]:
    req = plan.request
    kind = req.accelerator.kind
    seqs = int(default.get(Knob.MAX_NUM_SEQS))
    batched = int(default.get(Knob.MAX_NUM_BATCHED_TOKENS))
    low_b, high_b = _BATCHED_RANGE[kind]
    axes = [
        Axis(Knob.MAX_NUM_SEQS, ladder(1, max(seqs, _SEQS_CAP[kind]), extra=[seqs]), 2),
        Axis(
            Knob.MAX_NUM_BATCHED_TOKENS,
            ladder(min(low_b, batched), max(batched, high_b), extra=[batched]),
            2,
        ),
        Axis(Knob.MAX_MODEL_LEN, _model_lens(plan, default, longest)),
    ]
    notes: list[str] = []
    if cpu:
        notes.append(
            "cpu_kv_cache_space_gib is held as configured: on CPU the KV cache is host memory "
            "sized in bytes; raise it in fleet.yaml if the host has room"
        )
    else:
        util = float(default.get(Knob.GPU_MEMORY_UTILIZATION))
        values = tuple(sorted({*_gpu_utilizations(req.replicas_per_gpu), util}))
        axes.append(Axis(Knob.GPU_MEMORY_UTILIZATION, values))
        axes.append(Axis(Knob.TENSOR_PARALLEL_SIZE, _tps(plan)))
    axes.append(Axis(Knob.KV_CACHE_DTYPE, _kv_dtypes(req, cpu, cpu_fp8_kv, notes)))
    axes.append(Axis(Knob.WEIGHTS_DTYPE, _weight_dtypes(req, cpu, notes)))
    return tuple(a for a in axes if len(a.values) > 1), tuple(notes)


def _gpu_utilizations(replicas_per_gpu: int) -> tuple[float, ...]:
    """The memory shares to try: each replica's share of them when replicas share a GPU
    (rounded down, so that together they never ask for more than the GPU)."""
    if replicas_per_gpu == 1:
        return _GPU_UTILIZATIONS
    return tuple(math.floor(u / replicas_per_gpu * 1000) / 1000 for u in _GPU_UTILIZATIONS)


def _model_lens(plan: Plan, default: TrialConfig, longest: int) -> tuple[int, ...]:
    model_max = plan.request.model.max_position_embeddings
    need = min(model_max, -(-longest // 256) * 256)
    current = int(default.get(Knob.MAX_MODEL_LEN))
    values = {need, current}
    power = 1024
    while power <= min(model_max, max(current, need) * 4):
        if power >= need:
            values.add(power)
        power *= 2
    return tuple(sorted(values))


def _tps(plan: Plan) -> tuple[int, ...]:
    pp = plan.option.parallelism.pp
    tps = {
        o.parallelism.tp
        for o in plan.assessment.options
        if o.parallelism.pp == pp and o.parallelism.dp == 1
    }
    return tuple(sorted(tps | {plan.option.parallelism.tp}))


def _kv_dtypes(req: PlanRequest, cpu: bool, cpu_fp8_kv: bool, notes: list[str]) -> tuple[str, ...]:
    if req.kv_dtype.is_fp8:
        return (req.kv_dtype.value,)
    if cpu and not cpu_fp8_kv:
        notes.append("no fp8 KV cache: vLLM-CPU needs AVX-512 or AMX for it")
        return (req.kv_dtype.value,)
    return (req.kv_dtype.value, KvDtype.FP8.value)


def _weight_dtypes(req: PlanRequest, cpu: bool, notes: list[str]) -> tuple[str, ...]:
    base = req.weights_dtype
    online = not cpu and req.accelerator.supports_native(WeightDtype.FP8)
    if base.bytes_per_param > WeightDtype.FP8.bytes_per_param and online:
        return (base.value, WeightDtype.FP8.value)
    if base.bytes_per_param > WeightDtype.FP8.bytes_per_param:
        notes.append(
            f"weights stay {base.value}: quantizing them needs online fp8 (a GPU with native "
            "fp8) or a quantized checkpoint (AWQ/GPTQ), which tune cannot make"
        )
    return (base.value,)


def _checker(req: PlanRequest, longest: int, pp: int) -> Check:
    model_max = req.model.max_position_embeddings

    @functools.lru_cache(maxsize=4096)
    def check(trial: TrialConfig) -> str | None:
        seqs = int(trial.get(Knob.MAX_NUM_SEQS))
        batched = int(trial.get(Knob.MAX_NUM_BATCHED_TOKENS))
        model_len = int(trial.get(Knob.MAX_MODEL_LEN))
        if batched < seqs:
            return f"max_num_batched_tokens {batched} < max_num_seqs {seqs}: vLLM refuses it"
        if model_len < longest:
            return f"max_model_len {model_len} is shorter than the longest request ({longest})"
        if model_len > model_max:
            return f"max_model_len {model_len} is above the model's {model_max} positions"
        return _fits(_request(req, trial), trial, pp)

    return check


def _request(req: PlanRequest, trial: TrialConfig) -> PlanRequest:
    changes: dict[str, object] = {
        "max_num_seqs": int(trial.get(Knob.MAX_NUM_SEQS)),
        "max_num_batched_tokens": int(trial.get(Knob.MAX_NUM_BATCHED_TOKENS)),
        "max_model_len": int(trial.get(Knob.MAX_MODEL_LEN)),
        "kv_dtype": KvDtype(str(trial.get(Knob.KV_CACHE_DTYPE))),
        "weights_dtype": WeightDtype(str(trial.get(Knob.WEIGHTS_DTYPE))),
    }
    if trial.has(Knob.GPU_MEMORY_UTILIZATION):
        changes["gpu_memory_utilization"] = float(trial.get(Knob.GPU_MEMORY_UTILIZATION))
    if trial.has(Knob.CPU_KV_CACHE_SPACE_GIB):
        gib = float(trial.get(Knob.CPU_KV_CACHE_SPACE_GIB))
        changes["accelerator"] = with_overrides(req.accelerator, memory_gib=gib)
    return req.replace(**changes)


def _fits(req: PlanRequest, trial: TrialConfig, pp: int) -> str | None:
    tp = int(trial.get(Knob.TENSOR_PARALLEL_SIZE)) if trial.has(Knob.TENSOR_PARALLEL_SIZE) else 1
    found = assess(req)
    option = next(
        (
            o
            for o in found.options
            if o.parallelism.tp == tp and o.parallelism.pp == pp and o.parallelism.dp == 1
        ),
        None,
    )
    if option is None:
        return f"TP{tp} is not a layout of {req.model.name} on {req.accelerator.name}"
    if not option.fits:
        short = option.shortfall_bytes(int(trial.get(Knob.MAX_MODEL_LEN)))
        return f"the planner says it does not fit ({short / GB:.1f} GB short per device)"
    return None
