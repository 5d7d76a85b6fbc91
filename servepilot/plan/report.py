"""What a plan tells a reader, as plain text: the headline, the tables and the lines.

The terminal (cli/plan_cmd.py) only draws these; what each one says, and how its numbers
are formatted, is decided here beside the plan it describes.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.texttable import TextTable
from servepilot.plan.estimate import Estimates
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.kv_offload import GIB, host_bytes_per_node
from servepilot.plan.planner import Plan

GB = 1e9


@dataclass(frozen=True, slots=True)
class CostLine:
    """The cost line in its three parts, which a terminal styles apart."""

    price: str
    """$/hour, and (when the target QPS is known) the nodes it needs, their $/hour, per QPS
    and per 1M output tokens."""
    over_line: str
    """A warning when the cost per QPS is over the $0.1 cost line; "" when it is not."""
    basis: str


def headline(plan: Plan) -> str:
    req, option = plan.request, plan.option
    weights = " (DUMMY weights: random, from its config alone)" if req.dummy_weights else ""
    shared = shared_note(plan)
    return (
        f"{req.model.name}{weights} on {req.nodes} x {req.count} {req.accelerator.name}: "
        f"{option.parallelism.describe()}, {option.replicas} replica(s){shared}"
    )


def shared_note(plan: Plan) -> str:
    """The headline's note of replicas sharing accelerators (2 replicas per GPU); "" when
    they do not."""
    shared = plan.request.replicas_per_gpu
    return f", {shared} replicas per GPU" if shared > 1 else ""


def verdict(plan: Plan) -> str:
    if plan.fits:
        return "fits"
    return f"does not fit: {plan.shortfall_bytes / GB:,.1f} GB short per device"


def kv_line(plan: Plan) -> str:
    option = plan.option
    offload = plan.request.kv_offload
    tokens = f"{option.kv_capacity_tokens:,} tokens per replica"
    if offload is not None and option.kv_cpu_tokens is not None:
        tokens = (
            f"{option.kv_capacity_tokens:,} tokens per replica on the GPU + "
            f"{option.kv_cpu_tokens:,} in host memory ({offload.describe()})"
        )
    return (
        f"KV cache: {option.kv.bytes_per_token:,.0f} B/token ({option.kv.formula}); {tokens}; "
        f"{option.max_concurrency:,.2f} requests of "
        f"{plan.assessment.setting.max_model_len:,} tokens"
    )


def host_tier_line(plan: Plan) -> str | None:
    """What the CPU tier pins on each node, taken when the replicas start; None: no tier."""
    offload, option = plan.request.kv_offload, plan.option
    if offload is None:
        return None
    per_node = host_bytes_per_node(offload, option.parallelism, option.replicas, plan.request.nodes)
    known = plan.request.accelerator.host_memory_bytes_per_node
    of = "" if known is None else f" of its {known / GIB:,.1f} GiB"
    return (
        f"KV tier in host memory: {offload.size_gib:g} GiB per replica, "
        f"{per_node / GIB:,.1f} GiB per node{of}, pinned when the replicas start"
    )


def advice_line(plan: Plan) -> str:
    return f"advice: {plan.advice.deployment.value}: " + "; ".join(plan.advice.reasons)


def memory_table(plan: Plan) -> TextTable:
    mem = plan.option.memory
    cpu = plan.request.accelerator.kind is AcceleratorKind.CPU
    shared = plan.request.replicas_per_gpu
    outside = "outside gpu_memory_utilization"
    title = "memory per device"
    if shared > 1:
        outside += " (the other replicas' shares included)"
        title = f"memory per device, one replica's share ({shared} replicas per GPU)"
    parts = [
        ("weights", mem.weights_bytes, "in host memory" if cpu else "per rank, experts included"),
        ("activations", mem.activation_bytes, "estimate: profiling pass at max_num_batched_tokens"),
        ("runtime", mem.runtime_bytes, "estimate: CUDA context, NCCL, CUDA graphs"),
        ("KV cache", mem.kv_bytes, "what is left" if not cpu else "--kv-cache-memory-bytes"),
        ("headroom", mem.headroom_bytes, outside),
        ("total", mem.total_bytes, plan.request.accelerator.name),
    ]
    rows = tuple((name, f"{value / GB:,.2f}", note) for name, value, note in parts)
    return TextTable(title, ("part", "GB", "note"), rows, right=("GB",))


def knob_table(plan: Plan) -> TextTable:
    rows = tuple(
        (name, knob_value(knob.value), knob.reason) for name, knob in plan.knobs.as_dict().items()
    )
    return TextTable("knobs", ("knob", "value", "why"), rows, right=("value",))


def knob_value(value: object) -> str:
    """`-` for unset, thousands separators for counts, anything else as it prints."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def ladder_table(plan: Plan) -> TextTable:
    rows = tuple(
        (
            step.action,
            "yes" if step.fits else "no",
            step.layout,
            f"{step.weights_per_rank_bytes / GB:,.1f}",
            f"{step.kv_capacity_tokens:,}",
            f"{step.max_concurrency:,.2f}",
        )
        for step in plan.ladder
    )
    columns = ("step", "fits", "layout", "weights GB/device", "KV tokens", "concurrency")
    return TextTable("to make it fit (the memory ladder)", columns, rows)


def estimates_table(found: Estimates) -> TextTable:
    points = (("one request alone", found.idle), ("at capacity", found.capacity))
    rows = tuple(
        (
            name,
            f"{point.concurrency:,.1f}",
            f"{point.ttft_ms:,.1f}",
            f"{point.tpot_ms:,.2f}",
            f"{point.output_tokens_per_s:,.0f}",
            f"{point.requests_per_s:,.2f}",
        )
        for name, point in points
    )
    columns = ("load", "in flight", "TTFT ms", "TPOT ms", "output tok/s", "requests/s")
    title = f"estimates per replica (step times: {found.source})"
    return TextTable(title, columns, rows, right=columns[1:], caption=_estimates_caption(found))


def _estimates_caption(found: Estimates) -> str:
    lines = [
        f"capacity is bounded by {found.limit.value}; {found.replicas} replica(s): "
        f"{found.fleet_output_tokens_per_s:,.0f} output tok/s, "
        f"{found.fleet_requests_per_s:,.2f} requests/s",
    ]
    if found.replicas_for_target is not None:
        lines.append(f"the target QPS needs {found.replicas_for_target} replica(s) at capacity")
    lines.append(
        "steady state at the mean lengths, no queueing; `servepilot sim` for queues and "
        "bursts, `servepilot bench` to measure"
    )
    return "\n".join(lines)


def cost_line(plan: Plan) -> CostLine:
    c, qps = plan.cost, plan.request.traffic.target_qps
    price = f"cost: ${c.usd_per_hour:,.2f}/hour"
    over_line = ""
    if (
        qps is not None
        and c.usd_per_qps is not None
        and c.usd_per_million_output_tokens is not None
        and c.usd_per_hour_for_target is not None
    ):
        price += (
            f" as planned; {qps:,.0f} QPS needs {c.nodes_for_target} node(s): "
            f"${c.usd_per_hour_for_target:,.2f}/hour, ${c.usd_per_qps:,.4f} per QPS-hour, "
            f"${c.usd_per_million_output_tokens:,.3f} per 1M output tokens"
        )
        if c.over_qps_line:
            over_line = " (over the $0.1 per QPS cost line)"
    return CostLine(price, over_line, f" — {c.basis}")
