"""Where a level's load fell short of its name, in words for the terminal and the report:
requests the server refused, and a level that never ran at its load (its numbers then
describe a lighter load, so it is never the sweet spot).
"""

from __future__ import annotations

from servepilot.bench.report.fmt import level_name
from servepilot.core.results import ClientHealth, LoadMode, Run
from servepilot.load.sweep import failure_shares

LEAK_BYTES_PER_REQUEST = 2 * 2**20
"""A leak, in seed 000's words: resident memory growing by more than 2 MB per request."""


def is_leak(growth_bytes_per_request: float | None) -> bool:
    """The one leak rule, for the target and for each memory source alike."""
    return (
        growth_bytes_per_request is not None and growth_bytes_per_request > LEAK_BYTES_PER_REQUEST
    )


def client_limited(run: Run) -> ClientHealth | None:
    """The client's health when the client, not the server, limited `run`."""
    return run.client if run.client is not None and run.client.client_bound else None


def leak_bytes_per_request(run: Run) -> float | None:
    """The target's memory growth per request when it is a leak by LEAK_BYTES_PER_REQUEST."""
    growth = run.memory_growth_bytes_per_request
    return growth if growth is not None and is_leak(growth) else None


def leaking_sources(run: Run) -> dict[str, float]:
    """The memory sources (replica processes, GPUs) of a soak that leak by the same rule,
    with their growth per request."""
    by_source = run.memory_growth_by_source_bytes_per_request
    return {name: growth for name, growth in by_source.items() if is_leak(growth)}


def shortfalls(run: Run) -> tuple[str, ...]:
    """One sentence per shortfall of `run`; none for a level that ran as named."""
    found = []
    if run.refused:
        waited = (
            f"; workers waited out Retry-After for {run.retry_wait_s:,.1f} s in all"
            if run.retry_wait_s
            else ""
        )
        found.append(
            f"at {level_name(run.load)} the server shed load: {failure_shares(run)}{waited}"
        )
    if not run.load_reached:
        found.append(
            f"{level_name(run.load)} never reached its load: {_why_short(run)}; "
            "not a candidate for the sweet spot"
        )
    return tuple(found)


def _why_short(run: Run) -> str:
    if run.load.mode is LoadMode.CONCURRENCY:
        peak = run.peak_in_flight or 0
        sent = run.completed + run.failed
        cause = (
            f"only {sent} requests were sent (give --requests at least {run.load.value:g})"
            if sent < run.load.value
            else "requests ended before others started"
        )
        return f"at most {peak} requests were in flight, {cause}"
    achieved = run.client.achieved_rate if run.client is not None else 0.0
    return f"the client sent {achieved:.2f} req/s (use --processes or a bigger client machine)"
