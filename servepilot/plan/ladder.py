"""When a deployment does not fit: the memory ladder, each rung with its numbers.

Cut max_model_len, quantize the KV cache, quantize the weights (each rung keeps the ones
before it), and, instead of quantizing, more accelerators: first more of the node's (TP
inside one node), then more nodes (PP across them) only when a whole node is too small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servepilot.plan.checkpoint import checkpoint_for, needs_quantized_checkpoint
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.layout import Option
from servepilot.plan.request import PlanRequest

MAX_NODES = 16


@dataclass(frozen=True, slots=True)
class LadderStep:
    action: str
    changes: dict[str, object]
    """PlanRequest fields this rung sets (cumulative with the rungs before, except nodes)."""
    request: PlanRequest
    """The whole request on this rung, to plan it in full."""
    fits: bool
    layout: str
    weights_per_rank_bytes: int
    kv_capacity_tokens: int
    max_concurrency: float

    @property
    def widens(self) -> bool:
        """The rung adds accelerators or nodes instead of shrinking the model."""
        return "count" in self.changes or "nodes" in self.changes


Assess = Callable[[PlanRequest], tuple[Option | None, Option]]
"""A request -> (the chosen layout if one fits, the closest layout either way)."""


def build_ladder(req: PlanRequest, model_len: int, assess: Assess) -> tuple[LadderStep, ...]:
    steps: list[LadderStep] = []
    current = req.replace(max_model_len=model_len)
    for action, changes in _rungs(current):
        current = current.replace(**changes)
        steps.append(_step(action, changes, current, assess))
    wider = _more_accelerators(req.replace(max_model_len=model_len), assess)
    if wider is not None:
        action, changes = wider
        steps.append(
            _step(action, changes, req.replace(max_model_len=model_len, **changes), assess)
        )
    return tuple(steps)


def _rungs(req: PlanRequest) -> list[tuple[str, dict[str, object]]]:
    rungs: list[tuple[str, dict[str, object]]] = []
    wanted = req.wanted_model_len
    if req.max_model_len is not None and wanted < req.max_model_len:
        rungs.append(
            (
                f"cut max_model_len {req.max_model_len:,} -> {wanted:,} (the traffic's longest)",
                {"max_model_len": wanted},
            )
        )
    if not req.kv_dtype.is_fp8:
        rungs.append(("quantize the KV cache to fp8", {"kv_dtype": KvDtype.FP8}))
    fp8 = req.accelerator.supports_native(WeightDtype.FP8)
    if req.weights_dtype.bytes_per_param > WeightDtype.FP8.bytes_per_param:
        target = WeightDtype.FP8 if fp8 else WeightDtype.INT8
        rungs.append(_quantize(req, target, target.value))
    if req.weights_dtype.bytes_per_param > WeightDtype.AWQ.bytes_per_param:
        rungs.append(_quantize(req, WeightDtype.AWQ, "4 bits"))
    return rungs


def _quantize(req: PlanRequest, target: WeightDtype, what: str) -> tuple[str, dict[str, object]]:
    """The rung that quantizes the weights; it names the checkpoint when vLLM cannot quantize
    the published one as it loads it."""
    action = f"quantize the weights to {what}"
    if needs_quantized_checkpoint(req.model, target):
        action += f": serve {checkpoint_for(req.model, req.model_ref, target).model}"
    return action, {"weights_dtype": target}


def _step(action: str, changes: dict[str, object], req: PlanRequest, assess: Assess) -> LadderStep:
    chosen, closest = assess(req)
    option = chosen or closest
    return LadderStep(
        action=action,
        changes=changes,
        request=req,
        fits=chosen is not None,
        layout=option.parallelism.describe(),
        weights_per_rank_bytes=option.memory.weights_bytes,
        kv_capacity_tokens=option.kv_capacity_tokens if chosen else 0,
        max_concurrency=option.max_concurrency if chosen else 0.0,
    )


def _more_accelerators(req: PlanRequest, assess: Assess) -> tuple[str, dict[str, object]] | None:
    """At the original precision: the fewest of the node's accelerators that fit (TP inside
    the node), else the fewest whole nodes up to 16 (PP across them), if any."""
    if req.accelerator.kind is AcceleratorKind.CPU:
        return None  # one vLLM-CPU server per replica, on one host: nothing to widen
    per_node = req.accelerator.gpus_per_node
    count = req.count * 2
    while count <= per_node:
        if assess(req.replace(count=count))[0] is not None:
            return f"or, at the original precision, use {count} accelerators of the node", {
                "count": count
            }
        count *= 2
    full = max(req.count, per_node)
    for nodes in range(req.nodes + 1, MAX_NODES + 1):
        if assess(req.replace(count=full, nodes=nodes))[0] is not None:
            changes: dict[str, object] = {"nodes": nodes}
            if full != req.count:
                changes["count"] = full
            return f"or, at the original precision, use {nodes} nodes of {full}", changes
    return None
