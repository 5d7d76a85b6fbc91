"""Drives one process's share of a load: the closed loop's workers or the open loop's schedule.

A load is a sequence of slots (global positions 0, 1, 2, ...); slot q sends request
q mod len(requests). With several processes, process p of P takes the slots q with
q mod P == p, and its share of the closed loop's concurrency; every process computes the same
global schedule from the same seed, so no coordination is needed while the load runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from servepilot.bench.client import Client
from servepilot.bench.records import RequestRecord, RequestSpec
from servepilot.core.results import LoadMode
from servepilot.load.arrivals import iter_arrival_offsets_s
from servepilot.load.loadplan import LoadPlan

ProgressFn = Callable[[int, int, float], None]
PROGRESS_EVERY_S = 0.2


class Slot(NamedTuple):
    request: int
    """Position in the run's request list."""
    intended_s: float | None
    """The scheduled send time (open loop); None in the closed loop."""
    warmup: bool


@dataclass(slots=True)
class Tally:
    """What one process's share of the load produced."""

    records: list[RequestRecord] = field(default_factory=list)
    lags_s: list[float] = field(default_factory=list)
    """Open loop: actual minus intended send time. Closed loop: a worker's turnaround, from
    its previous answer's end to its next send."""
    completed: int = 0
    failed: int = 0
    no_usage: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    t0: float = 0.0
    """The perf_counter() origin of the records' times."""

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)
        if record.error is None:
            self.completed += 1
        else:
            self.failed += 1


def raise_fd_limit() -> None:
    """Lift the soft limit on open files to the hard one: every connection is a descriptor,
    and the usual soft limit (1024) is below the concurrency a load test may need."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def concurrency_share(concurrency: int, part: int, parts: int) -> int:
    return concurrency // parts + (1 if part < concurrency % parts else 0)


class ClosedSlots:
    """Closed-loop slots of process `part`; the clock decides warm-up by time and the end.

    Shared by the process's workers: each takes the next slot when its previous answer is in.
    `end_s` is when a duration-bound run stops handing out slots (known from its first
    measured slot on).
    """

    def __init__(
        self, plan: LoadPlan, count: int, part: int, parts: int, clock: Callable[[], float]
    ) -> None:
        self.plan, self.count, self.parts, self.clock = plan, count, parts, clock
        self.quota = (
            None if plan.max_requests is None else len(range(part, plan.max_requests, parts))
        )
        self.position, self.measured = part, 0
        self.stopped = False
        self.end_s: float | None = None

    def __iter__(self) -> Iterator[Slot]:
        return self

    def __next__(self) -> Slot:
        plan, now = self.plan, self.clock()
        if self.stopped:
            raise StopIteration
        warm = self.position < plan.warmup_requests or now < plan.warmup_s
        if not warm:
            if self.end_s is None and plan.duration_s is not None:
                self.end_s = now + plan.duration_s
            if (self.quota is not None and self.measured >= self.quota) or (
                self.end_s is not None and now >= self.end_s
            ):
                self.stopped = True
                raise StopIteration
            self.measured += 1
        slot = Slot(self.position % self.count, None, warm)
        self.position += self.parts
        return slot


def open_slots(
    plan: LoadPlan, requests: Sequence[RequestSpec], part: int, parts: int
) -> Iterator[Slot]:
    """Open-loop slots of process `part`: the global schedule, decided before the run."""
    measured, measure_from = 0, 0.0
    for position, offset in enumerate(_offsets(plan, requests)):
        warm = position < plan.warmup_requests or offset < plan.warmup_s
        if not warm:
            if measured == 0:
                measure_from = offset
            if plan.max_requests is not None and measured >= plan.max_requests:
                return
            if plan.duration_s is not None and offset >= measure_from + plan.duration_s:
                return
            measured += 1
        if position % parts == part:
            yield Slot(position % len(requests), offset, warm)


def _offsets(plan: LoadPlan, requests: Sequence[RequestSpec]) -> Iterator[float]:
    times = [r.at_s for r in requests]
    if all(t is not None for t in times):
        return _trace_offsets([t for t in times if t is not None])
    return iter_arrival_offsets_s(
        plan.load.value, plan.arrival, burstiness=plan.burstiness, seed=plan.seed
    )


def _trace_offsets(times: list[float]) -> Iterator[float]:
    """A trace's own send times; repeated (shifted by its span plus one mean gap) if needed."""
    span = max(times) - min(times)
    period = span + (span / (len(times) - 1) if len(times) > 1 else 1.0)
    cycle = 0
    while True:
        for t in times:
            yield t + cycle * period
        cycle += 1


class Driver:
    """Runs one process's share of `plan` through `client`; times are relative to its t0."""

    def __init__(
        self,
        client: Client,
        plan: LoadPlan,
        requests: Sequence[RequestSpec],
        part: int = 0,
        parts: int = 1,
    ) -> None:
        self.client, self.plan, self.requests = client, plan, requests
        self.part, self.parts = part, parts
        self.tally = Tally()
        self._prepared = [client.prepare(spec) for spec in requests]

    def clock(self) -> float:
        return time.perf_counter() - self.client.t0

    async def run(self, on_progress: ProgressFn | None = None) -> Tally:
        """Wait for t0, drive the load, and return the tally (records in completion order)."""
        if (wait := -self.clock()) > 0:
            await asyncio.sleep(wait)
        self.tally.t0 = self.client.t0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        ticker = asyncio.ensure_future(self._tick(on_progress)) if on_progress else None
        try:
            if self.plan.load.mode is LoadMode.CONCURRENCY:
                await self._closed()
            else:
                await self._open()
        finally:
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
        self.tally.cpu_s = time.process_time() - cpu0
        self.tally.wall_s = time.perf_counter() - wall0
        self.tally.no_usage = self.client.no_usage
        if on_progress is not None:
            on_progress(self.tally.completed, self.tally.failed, self.clock())
        return self.tally

    async def _tick(self, on_progress: ProgressFn) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            on_progress(self.tally.completed, self.tally.failed, self.clock())

    async def _closed(self) -> None:
        share = concurrency_share(int(self.plan.load.value), self.part, self.parts)
        slots = ClosedSlots(self.plan, len(self.requests), self.part, self.parts, self.clock)
        workers = [asyncio.ensure_future(self._worker(slots)) for _ in range(share)]
        await self._until_end(workers, lambda: slots.end_s)

    async def _worker(self, slots: Iterator[Slot]) -> None:
        client, tally, requests, prepared = self.client, self.tally, self.requests, self._prepared
        previous_done = None
        for slot in slots:
            record = await client.send(
                requests[slot.request], prepared[slot.request], warmup=slot.warmup
            )
            if previous_done is not None and not slot.warmup:
                tally.lags_s.append(record.sent_s - previous_done)
            previous_done = record.extra["done_s"]
            tally.add(record)

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Future[None]] = set()
        for slot in open_slots(self.plan, self.requests, self.part, self.parts):
            assert slot.intended_s is not None
            # Absolute schedule: a late wake-up shortens the next wait instead of drifting;
            # an early one (uvloop's timers round to 1 ms) just sleeps again.
            while (wait := slot.intended_s - self.clock()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            task = loop.create_task(self._one(slot, slot.intended_s))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            await asyncio.sleep(0)  # let it write its request before the next slot is due
        stop_s = self.clock()
        await self._until_end(list(in_flight), lambda: stop_s)

    async def _one(self, slot: Slot, intended_s: float) -> None:
        request = slot.request
        record = await self.client.send(
            self.requests[request],
            self._prepared[request],
            intended_s=intended_s,
            warmup=slot.warmup,
        )
        self.tally.lags_s.append(record.sent_s - intended_s)
        self.tally.add(record)

    async def _until_end(
        self, tasks: Sequence[asyncio.Future[None]], stopped: Callable[[], float | None]
    ) -> None:
        """Wait for `tasks`. A duration-bound run gives the requests still in flight when it
        stopped sending `grace_s` to finish, then ends them as `cancelled_at_end`."""
        pending = set(tasks)
        while pending:
            stop_s = stopped() if self.plan.duration_s is not None else None
            timeout = None if stop_s is None else stop_s + self.plan.grace_s - self.clock()
            if timeout is not None and timeout <= 0:
                self.client.abort_all("cancelled_at_end", "the run ended before the answer did")
                timeout = None
            elif stop_s is None and self.plan.duration_s is not None:
                timeout = 0.05  # the closed loop has not stopped yet: look again soon
            done, pending = await asyncio.wait(
                pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                task.result()  # a bug in a worker should surface, not vanish
