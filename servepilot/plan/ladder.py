"""When a deployment does not fit: the memory ladder, each rung with its numbers.

Cut max_model_len, quantize the KV cache, quantize the weights (each rung keeps the ones
before it, and its label says all it changes from the original), and, instead of quantizing,
more accelerators: first more of the node's (TP inside one node), then more nodes (PP across
them) only when a whole node is too small. A count the user pinned (--count, --nodes) is
offered to change only when no other rung fits; the rung names the flags it changes.
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
    if wider is not None and req.pinned_hardware & wider[1].keys():
        # Changing what the user pinned is another plan: worth naming only as a last resort.
        wider = None if any(step.fits for step in steps) else wider
    if wider is not None:
        action, changes = wider
        steps.append(
            _step(action, changes, req.replace(max_model_len=model_len, **changes), assess)
        )
    return tuple(steps)


def _rungs(req: PlanRequest) -> list[tuple[str, dict[str, object]]]:
    """Each rung's label and what it changes on top of the rungs before; the label names
    every change from the original (cut, KV, weights), so none hides in an earlier row."""
    rungs: list[tuple[str, dict[str, object]]] = []
    cut = kv = ""
    wanted = req.wanted_model_len
    if req.max_model_len is not None and wanted < req.max_model_len:
        cut = f"cut max_model_len {req.max_model_len:,} -> {wanted:,} (the traffic's longest)"
        rungs.append((cut, {"max_model_len": wanted}))
    if not req.kv_dtype.is_fp8:
        kv = "the KV cache to fp8"
        rungs.append((_label(cut, kv, ""), {"kv_dtype": KvDtype.FP8}))
    fp8 = req.accelerator.supports_native(WeightDtype.FP8)
    if req.weights_dtype.bytes_per_param > WeightDtype.FP8.bytes_per_param:
        target = WeightDtype.FP8 if fp8 else WeightDtype.INT8
        rungs.append(_quantize(req, target, _label(cut, kv, _weights(req, target, target.value))))
    if req.weights_dtype.bytes_per_param > WeightDtype.AWQ.bytes_per_param:
        four_bits = _weights(req, WeightDtype.AWQ, "4 bits")
        rungs.append(_quantize(req, WeightDtype.AWQ, _label(cut, kv, four_bits)))
    return rungs


def _label(cut: str, kv: str, weights: str) -> str:
    """`cut, quantize the KV cache to fp8 and the weights to 4 bits: serve X`, with the parts
    given ("" for a part the ladder has not changed)."""
    quantized = " and ".join(part for part in (kv, weights) if part)
    return ", ".join(part for part in (cut, quantized and f"quantize {quantized}") if part)


def _weights(req: PlanRequest, target: WeightDtype, what: str) -> str:
    """The weights' part of a label; it names the checkpoint when vLLM cannot quantize the
    published one as it loads it."""
    part = f"the weights to {what}"
    if needs_quantized_checkpoint(req.model, target):
        part += f": serve {checkpoint_for(req.model, req.model_ref, target).model}"
    return part


def _quantize(req: PlanRequest, target: WeightDtype, action: str) -> tuple[str, dict[str, object]]:
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
    req = req.replace(layout=None)  # more accelerators take another layout
    per_node = req.accelerator.gpus_per_node
    count = req.count * 2
    while count <= per_node:
        if assess(req.replace(count=count))[0] is not None:
            return _widen({"count": count})
        count *= 2
    full = max(req.count, per_node)
    for nodes in range(req.nodes + 1, MAX_NODES + 1):
        if assess(req.replace(count=full, nodes=nodes))[0] is not None:
            changes: dict[str, object] = {"nodes": nodes}
            if full != req.count:
                changes = {"count": full, "nodes": nodes}
            return _widen(changes)
    return None


def _widen(changes: dict[str, object]) -> tuple[str, dict[str, object]]:
    """The rung as the flags to change: it is another plan, not an option within this one."""
    flags = " ".join(f"--{name} {value}" for name, value in changes.items())
    return f"or, at the original precision, with {flags}", changes
