"""Generates one load level against a target and reports what happened, honestly.

Closed loop (`concurrency`): N workers, each sending its next request as soon as its previous
answer is in. Open loop (`rate`): requests are sent on an absolute schedule of intended send
times whether or not earlier ones have finished, and latency counts from the intended time,
so a stalling server cannot hide its stall by slowing the client down (no coordinated
omission). The outcome also says how well the client kept up (`ClientHealth`), so a result
limited by the load generator is flagged as such instead of being blamed on the server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.bench.client import Client, Target
from servepilot.bench.drive import Driver, ProgressFn, Tally, raise_fd_limit
from servepilot.bench.records import RequestRecord, RequestSpec
from servepilot.bench.workers import PRECONNECT_MAX, ProcessesInterrupted, run_processes
from servepilot.core.errors import ConfigError
from servepilot.core.results import ClientHealth, LoadMode, Stats
from servepilot.load.loadplan import LoadPlan

__all__ = ["LoadInterrupted", "LoadOutcome", "LoadPlan", "choose_processes", "run_load"]

EVENTS_PER_PROCESS_S = 80_000.0
"""Streamed events one client process reads per second at 100% of a core. Measured with
make bench-client's stub on one core of a 2-core CPU VM: answers streamed token by token cost
about 12.6 us per event, the rest of a request about 16 events; so 16-token answers ran at
about 2,500 requests/s (80,000 events/s) with the process at 100%."""
EVENTS_PER_REQUEST = 16.0
"""What the rest of a request (connection, request, head, role/finish/usage/[DONE] events,
record) costs, counted in events."""
HEADROOM = 0.5
"""Plan processes for twice the expected load, so pacing stays precise and bursts fit."""

LAG_LIMIT_MS = 10.0
"""Send lag (p99) above which the client, not the server, is said to limit the load."""
RATE_SHORTFALL = 0.95
CPU_LIMIT = 0.9
"""Closed loop: a client process this busy (share of one core) is the bottleneck."""


@dataclass(frozen=True, slots=True, repr=False)
class LoadOutcome:
    records: tuple[RequestRecord, ...]
    """All requests, warm-up ones included (marked), in order of intended send time."""
    started_at: float
    """Wall-clock time (Unix seconds) of the run's t0, the origin of every record's times."""
    duration_s: float
    """The measured window: first measured intended send to the last measured answer."""
    client: ClientHealth
    no_usage: int = 0
    """Successful requests whose stream carried no usage: their token counts are unknown."""
    client_cpu: float = 0.0
    """CPU used by the busiest client process, as a share of one core."""
    retry_wait_s: float = 0.0
    """Closed loop: time the workers spent waiting out the server's Retry-After."""
    peak_in_flight: int = 0
    """The most requests in flight at once (warm-up ones included)."""
    load_reached: bool = True
    """False when the level never ran at its load: fewer requests in flight than its
    concurrency, or an open-loop rate the client fell short of."""

    def __repr__(self) -> str:
        # Short on purpose: asyncio formats the repr of a finished main task's result when
        # the runner closes, which for every record of a long run takes seconds.
        return (
            f"LoadOutcome({len(self.records)} records, duration_s={self.duration_s:.3f}, "
            f"client={self.client!r})"
        )


class LoadInterrupted(asyncio.CancelledError):
    """A cancellation (Ctrl-C) cut the load short. It carries what had finished by then, for a
    caller that can keep part of a level (a soak's finished windows); being a CancelledError,
    it stops every other caller exactly as a plain cancellation would."""

    def __init__(self, outcome: LoadOutcome, stopped_s: float) -> None:
        super().__init__("the load was interrupted")
        self.outcome = outcome
        self.stopped_s = stopped_s
        """When it was cut, on the records' clock."""


def ended_by(outcome: LoadOutcome, end_s: float) -> LoadOutcome:
    """`outcome` with only the requests that ended by `end_s` (the records' clock)."""
    kept = tuple(r for r in outcome.records if r.end_s <= end_s)
    return dataclasses.replace(outcome, records=kept, duration_s=_measured_span_s(kept))


def choose_processes(plan: LoadPlan, requests: Sequence[RequestSpec]) -> int:
    """Client processes for `plan`: its `processes` when set, else enough for the load.

    Open loop: the expected stream events per second (rate x (output tokens + the cost of a
    request in events)) against half of what one process parsed per second in the
    bench-client benchmark, capped by the usable cores. Closed loop: one process, whose
    limit is reported (`client_bound`) rather than guessed, since the throughput is the
    server's to decide; pass `processes` to spread a closed loop.
    """
    if plan.processes is not None:
        return plan.processes
    if plan.load.mode is LoadMode.CONCURRENCY or not requests:
        return 1
    tokens = sum(r.max_tokens for r in requests) / len(requests)
    events_per_s = plan.load.value * (tokens + EVENTS_PER_REQUEST)
    wanted = math.ceil(events_per_s / (EVENTS_PER_PROCESS_S * HEADROOM))
    return max(1, min(wanted, _usable_cores()))


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


async def run_load(
    target: Target,
    plan: LoadPlan,
    requests: Sequence[RequestSpec],
    *,
    on_progress: ProgressFn | None = None,
) -> LoadOutcome:
    """Generate `plan`'s load from `requests` (used in order, cycling if the run needs more).

    `on_progress(completed, failed, elapsed_s)` is called about every 0.2 s. Never raises for
    anything the server does; failed requests are records with a reason.
    """
    if not requests:
        raise ConfigError("the workload has no requests")
    raise_fd_limit()
    processes = choose_processes(plan, requests)
    if processes == 1:
        client = Client(target)
        driver = Driver(client, plan, requests)
        try:
            tallies = [await _run_here(client, driver, on_progress)]
        except asyncio.CancelledError:
            started_at = time.time() - driver.clock()
            cut = outcome(plan, [driver.tally], started_at, processes)
            raise LoadInterrupted(cut, driver.clock()) from None
        started_at = time.time() - (time.perf_counter() - tallies[0].t0)
    else:
        started_at = time.time()
        try:
            tallies = await run_processes(target, plan, requests, processes, on_progress)
        except ProcessesInterrupted as stopped:
            started_at = time.time() - stopped.elapsed_s
            cut = outcome(plan, stopped.tallies, started_at, processes)
            raise LoadInterrupted(cut, stopped.elapsed_s) from None
        started_at -= time.perf_counter() - tallies[0].t0
    return outcome(plan, tallies, started_at, processes)


async def _run_here(client: Client, driver: Driver, on_progress: ProgressFn | None) -> Tally:
    plan = driver.plan
    try:
        if plan.load.mode is LoadMode.CONCURRENCY:
            await client.preconnect(min(int(plan.load.value), PRECONNECT_MAX))
        client.t0 = time.perf_counter()
        return await driver.run(on_progress)
    finally:
        await client.aclose()


def outcome(
    plan: LoadPlan, tallies: Sequence[Tally], started_at: float, processes: int
) -> LoadOutcome:
    """The outcome of a run from the tallies of its processes."""
    records = sorted((r for t in tallies for r in t.records), key=lambda r: r.intended_s)
    measured = [r for r in records if not r.warmup]
    duration = _measured_span_s(records)
    cpu = max((t.cpu_s / t.wall_s for t in tallies if t.wall_s > 0), default=0.0)
    # Warm-up requests count here: they load the server as much as measured ones do.
    peak = peak_in_flight(records)
    if plan.load.mode is LoadMode.RATE:
        health = _open_health(plan, measured, processes)
        reached = not _short(measured)
    else:
        reached = peak >= plan.load.value
        lags = [lag for t in tallies for lag in t.lags_s]
        completed = sum(1 for r in measured if r.ok)
        lag = summary_ms(lags)
        bound = (lag.p99 or 0.0) > LAG_LIMIT_MS or cpu >= CPU_LIMIT
        health = ClientHealth(
            requested_rate=None,
            achieved_rate=completed / duration if duration > 0 else 0.0,
            send_lag_ms=lag,
            client_bound=bound,
            processes=processes,
        )
    return LoadOutcome(
        records=tuple(records),
        started_at=started_at,
        duration_s=duration,
        client=health,
        no_usage=sum(t.no_usage for t in tallies),
        client_cpu=cpu,
        retry_wait_s=sum(t.retry_wait_s for t in tallies),
        peak_in_flight=peak,
        load_reached=reached,
    )


def _measured_span_s(records: Sequence[RequestRecord]) -> float:
    """The measured window: first measured intended send to the last measured answer."""
    measured = [r for r in records if not r.warmup]
    if not measured:
        return 0.0
    return max(r.end_s for r in measured) - min(r.intended_s for r in measured)


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """The most of `records` in flight at once (sent, their answer not yet done)."""
    # At equal times an end sorts before a start (-1 < 1): back to back is not overlap.
    edges = sorted([(r.sent_s, 1) for r in records] + [(r.extra["done_s"], -1) for r in records])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def _open_health(plan: LoadPlan, measured: list[RequestRecord], processes: int) -> ClientHealth:
    lag = summary_ms([r.sent_s - r.intended_s for r in measured])
    return ClientHealth(
        requested_rate=plan.load.value,
        achieved_rate=_rate([r.sent_s for r in measured]),
        send_lag_ms=lag,
        client_bound=_short(measured) or (lag.p99 or 0.0) > LAG_LIMIT_MS,
        processes=processes,
    )


def _short(measured: list[RequestRecord]) -> bool:
    """The open loop sent slower than its schedule."""
    achieved = _rate([r.sent_s for r in measured])
    # Against the schedule as drawn (a Poisson sample's own rate), not the nominal rate:
    # only the client's lateness should count as a shortfall.
    scheduled = _rate([r.intended_s for r in measured])
    return scheduled > 0 and achieved < RATE_SHORTFALL * scheduled


def _rate(times: list[float]) -> float:
    if len(times) < 2:
        return 0.0
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else 0.0


def summary_ms(values_s: Sequence[float]) -> Stats:
    """Mean and p50/p90/p99 (linear interpolation, as numpy's default) in milliseconds."""
    if not values_s:
        return Stats(mean=None, p50=None, p90=None, p99=None, count=0)
    ordered = sorted(v * 1000.0 for v in values_s)

    def pct(q: float) -> float:
        at = (len(ordered) - 1) * q
        low = math.floor(at)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (at - low)

    return Stats(
        mean=sum(ordered) / len(ordered),
        p50=pct(0.5),
        p90=pct(0.9),
        p99=pct(0.99),
        count=len(ordered),
    )
