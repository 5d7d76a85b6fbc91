"""How a plan reads in a terminal."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from servepilot.cli.console import out_console, simple_table
from servepilot.plan.estimate import Estimates
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.planner import Plan

GB = 1e9


def render_plan(plan: Plan, command: str | None, rung: str | None) -> None:
    req = plan.request
    option = plan.option
    headline = (
        f"{req.model.name} on {req.nodes} x {req.count} {req.accelerator.name}: "
        f"{option.parallelism.describe()}, {option.replicas} replica(s)"
    )
    verdict = (
        Text("fits", style="bold green")
        if plan.fits
        else Text(
            f"does not fit: {plan.shortfall_bytes / GB:,.1f} GB short per device", style="bold red"
        )
    )
    out_console.print(Text(headline + " — ") + verdict)
    out_console.print(_memory_table(plan))
    out_console.print(
        f"KV cache: {option.kv.bytes_per_token:,.0f} B/token ({option.kv.formula}); "
        f"{option.kv_capacity_tokens:,} tokens per replica; "
        f"{option.max_concurrency:,.2f} requests of "
        f"{plan.assessment.setting.max_model_len:,} tokens"
    )
    if plan.assessment.reason:
        out_console.print(f"layout: {plan.assessment.reason}")
    if plan.fits:
        out_console.print(_knob_table(plan))
    if plan.ladder:
        out_console.print(_ladder_table(plan))
    out_console.print(f"advice: {plan.advice.deployment.value}: " + "; ".join(plan.advice.reasons))
    for warning in plan.advice.warnings:
        out_console.print(Text("warning: ", style="yellow") + Text(warning))
    out_console.print(_cost_line(plan))
    if plan.estimates is not None:
        out_console.print(_estimates_table(plan.estimates))
    if command is None:
        out_console.print(Text("command: none; nothing fits, even on the ladder", style="red"))
    elif rung is not None:
        out_console.print(Text(f'command after "{rung}": ', style="bold") + Text(command))
    else:
        out_console.print(Text("command: ", style="bold") + Text(command))


def _estimates_table(found: Estimates) -> Table:
    rows = [
        (name, f"{point.concurrency:,.1f}", f"{point.ttft_ms:,.1f}", f"{point.tpot_ms:,.2f}",
         f"{point.output_tokens_per_s:,.0f}", f"{point.requests_per_s:,.2f}")
        for name, point in (("one request alone", found.idle), ("at capacity", found.capacity))
    ]  # fmt: skip
    columns = ("load", "in flight", "TTFT ms", "TPOT ms", "output tok/s", "requests/s")
    return simple_table(
        f"estimates per replica (step times: {found.source})", columns, rows, right=columns[1:],
        caption=_estimates_caption(found), caption_justify="left",
    )  # fmt: skip


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


def _memory_table(plan: Plan) -> Table:
    mem = plan.option.memory
    cpu = plan.request.accelerator.kind is AcceleratorKind.CPU
    rows = [
        ("weights", mem.weights_bytes, "in host memory" if cpu else "per rank, experts included"),
        ("activations", mem.activation_bytes, "estimate: profiling pass at max_num_batched_tokens"),
        ("runtime", mem.runtime_bytes, "estimate: CUDA context, NCCL, CUDA graphs"),
        ("KV cache", mem.kv_bytes, "what is left" if not cpu else "--kv-cache-memory-bytes"),
        ("headroom", mem.headroom_bytes, "outside gpu_memory_utilization"),
        ("total", mem.total_bytes, plan.request.accelerator.name),
    ]
    cells = [(name, f"{value / GB:,.2f}", note) for name, value, note in rows]
    return simple_table("memory per device", ("part", "GB", "note"), cells, right=("GB",))


def _knob_table(plan: Plan) -> Table:
    rows = [(name, _knob_value(knob.value), knob.reason)
            for name, knob in plan.knobs.as_dict().items()]  # fmt: skip
    return simple_table("knobs", ("knob", "value", "why"), rows, right=("value",))


def _knob_value(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _ladder_table(plan: Plan) -> Table:
    rows = [
        (step.action, "yes" if step.fits else "no", step.layout,
         f"{step.weights_per_rank_bytes / GB:,.1f}", f"{step.kv_capacity_tokens:,}",
         f"{step.max_concurrency:,.2f}")
        for step in plan.ladder
    ]  # fmt: skip
    columns = ("step", "fits", "layout", "weights GB/device", "KV tokens", "concurrency")
    return simple_table("to make it fit (seed 004's ladder)", columns, rows)


def _cost_line(plan: Plan) -> Text:
    c = plan.cost
    text = Text(f"cost: ${c.usd_per_hour:,.2f}/hour")
    if c.usd_per_qps is not None and c.usd_per_million_output_tokens is not None:
        text += Text(f", ${c.usd_per_qps:,.4f} per QPS-hour, "
                     f"${c.usd_per_million_output_tokens:,.3f} per 1M output tokens")  # fmt: skip
        if c.over_qps_line:
            text += Text(" (over seed 003's $0.1 per QPS line)", style="yellow")
    return text + Text(f" — {c.basis}", style="dim")
