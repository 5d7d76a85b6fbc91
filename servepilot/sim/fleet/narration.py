"""What `servepilot sim` says about the fleet it simulates and about each level it ran, as
lines of text. A terminal prints them (cli/sim_cmd.py); the wording is here, beside the
setup and the statistics it reads."""

from __future__ import annotations

from servepilot.core.results import Run
from servepilot.sim.fleet.records import FleetSpec, FleetStats
from servepilot.sim.fleet.setup import ReplicaSetup


def describe(setup: ReplicaSetup, spec: FleetSpec) -> tuple[str, ...]:
    """The replicas, where their step times come from, a profile's prompt overhead, the client
    delay."""
    s = setup.scheduler
    lines = [
        f"{spec.replicas} x {setup.model_name}: max_num_seqs {s.max_num_seqs}, "
        f"max_num_batched_tokens {s.max_num_batched_tokens:,}, {s.num_blocks:,} KV blocks of "
        f"{s.block_size} ({setup.kv_capacity_tokens:,} tokens), gateway budget "
        f"{spec.capacity} per replica",
        f"step times: {setup.cost_kind} ({spec.cost.source})",
    ]
    if setup.from_profile:  # without a profile there is no overhead to speak of
        lines.append(_prompt_overhead(setup))
    client_ms = spec.network.client_gateway_s * 1e3
    if client_ms:
        measured = spec.network.client_gateway_s == setup.request_overhead_s / 2
        lines.append(
            f"client delay: {client_ms:.1f} ms each way"
            + (" (half the request overhead the profile measured)" if measured else "")
        )
    return tuple(lines)


def _prompt_overhead(setup: ReplicaSetup) -> str:
    if setup.chat_template_tokens:
        return (
            f"prompt overhead: none on top of --input-tokens (the chat template's "
            f"{setup.chat_template_tokens} tokens are inside it, as bench sizes chat prompts)"
        )
    return f"prompt overhead: {setup.prompt_overhead_tokens} tokens per request" + (
        "" if setup.prompt_overhead_tokens else " (the profile does not say; 0 assumed)"
    )


def level_stats(run: Run, stats: FleetStats) -> str:
    """How long a level took to simulate and what the fleet did during it."""
    rate = (run.completed + run.failed) / stats.wall_s if stats.wall_s > 0 else 0.0
    text = (
        f"{stats.sim_s:,.1f} s simulated in {stats.wall_s:,.1f} s ({rate:,.0f} requests/s); "
        f"{stats.steps:,} steps, {stats.preemptions:,} preemptions, prefix hit rate "
        f"{stats.prefix_hit_rate:.0%} ({stats.cached_tokens_per_request:,.0f} cached tokens per "
        "request" + ("; routed on the exact index of the KV events)" if stats.kv_exact else ")")
    )
    if stats.scale_events is None:
        return text
    return (
        f"{text}; autoscaling: {stats.scale_events} scale events, {stats.replicas_peak} "
        f"replicas at most, {stats.replica_s / 3600:,.2f} replica-hours"
    ) + (
        f" awake and {stats.replica_asleep_s / 3600:,.2f} asleep (host memory, no GPU), "
        f"{stats.wakes} wakes"
        if stats.replica_asleep_s or stats.wakes
        else ""
    )
