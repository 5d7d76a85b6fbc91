"""Drives one process's share of a load: the closed loop's workers or the open loop's schedule.

Which request goes when (the slots, and each process's share of them) is `load.slots`'s, the
rule the simulator follows too; this module sends them and times the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from servepilot.bench.client import Client
from servepilot.bench.records import RequestRecord, RequestSpec
from servepilot.core.loop import cancel_and_wait
from servepilot.load.loadplan import LoadPlan
from servepilot.load.slots import (
    ClosedSlots,
    Slot,
    concurrency_share,
    open_slots,
    replay_times,
    send_times,
)

ProgressFn = Callable[[int, int, float], None]
PROGRESS_EVERY_S = 0.2


_TIMER_SLACK_S = 0.002
"""Added to the wait for t0: asyncio may run a timer up to its clock resolution early."""


@dataclass(slots=True)
class Tally:
    """What one process's share of the load produced."""

    records: list[RequestRecord] = field(default_factory=list)
    lags_s: list[float] = field(default_factory=list)
    """Open loop: actual minus intended send time. Closed loop: a worker's turnaround, from
    its previous answer's end to its next send."""
    completed: int = 0
    failed: int = 0
    retry_wait_s: float = 0.0
    """Closed loop: the time workers spent waiting out Retry-After, all workers together."""
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
        # The event loop may wake a timer up to its clock resolution (1 ms) early, and every
        # process's first request must leave at t0 or after.
        if (wait := -self.clock()) > 0:
            await asyncio.sleep(wait + _TIMER_SLACK_S)
        self.tally.t0 = self.client.t0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        ticker = asyncio.ensure_future(self._tick(on_progress)) if on_progress else None
        try:
            if self.plan.closed:
                await self._closed()
            else:
                await self._open()
        finally:
            if ticker is not None:
                await cancel_and_wait(ticker)
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
        slots = ClosedSlots(self.plan, len(self.requests), self.part, self.parts)
        workers = [asyncio.ensure_future(self._worker(slots)) for _ in range(share)]
        await self._until_end(workers, lambda: slots.end_s)

    async def _worker(self, slots: ClosedSlots) -> None:
        client, tally, requests, prepared = self.client, self.tally, self.requests, self._prepared
        previous_done = None
        while (slot := slots.next(self.clock())) is not None:
            record = await client.send(
                requests[slot.request], prepared[slot.request], warmup=slot.warmup
            )
            if previous_done is not None and not slot.warmup:
                tally.lags_s.append(record.sent_s - previous_done)
            previous_done = record.extra["done_s"]
            tally.add(record)
            if record.refused and record.retry_after_s:
                # A server that sheds load asked us to come back later: hammering it would
                # measure our own flood. The wait is not the client's lag.
                if not await self._wait_out(record.retry_after_s, slots):
                    return
                previous_done = self.clock()

    async def _wait_out(self, retry_after_s: float, slots: ClosedSlots) -> bool:
        """Sleep `retry_after_s`, no longer than the request timeout nor past the level's end;
        False when the level ends first (then the worker is done: a timer that wakes a hair
        early must not squeeze in one more request)."""
        wait = min(retry_after_s, self.client.target.timeout_s)
        left_s = None if slots.end_s is None else slots.end_s - self.clock()
        if left_s is not None and left_s <= wait:
            wait = max(left_s, 0.0)
        self.tally.retry_wait_s += wait
        await asyncio.sleep(wait)
        return left_s is None or left_s > wait

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Future[None]] = set()
        schedule = send_times(self.plan, replay_times([r.at_s for r in self.requests]))
        for slot in open_slots(self.plan, len(self.requests), schedule, self.part, self.parts):
            # Absolute schedule: a late wake-up shortens the next wait instead of drifting;
            # an early one (uvloop's timers round to 1 ms) just sleeps again.
            while (wait := slot.send_s - self.clock()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            task = loop.create_task(self._one(slot, slot.send_s))
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
        await until_end(self.client, self.plan, self.clock, tasks, stopped)


async def until_end(
    client: Client,
    plan: LoadPlan,
    clock: Callable[[], float],
    tasks: Sequence[asyncio.Future[None]],
    stopped: Callable[[], float | None],
) -> None:
    """Wait for `tasks`. A duration-bound run gives the requests still in flight when it
    stopped sending (`stopped()`, None while it sends) `grace_s` to finish, then ends them as
    `cancelled_at_end`."""
    pending = set(tasks)
    while pending:
        stop_s = stopped() if plan.duration_s is not None else None
        timeout = None if stop_s is None else stop_s + plan.grace_s - clock()
        if timeout is not None and timeout <= 0:
            client.abort_all("cancelled_at_end", "the run ended before the answer did")
            timeout = None
        elif stop_s is None and plan.duration_s is not None:
            timeout = 0.05  # the closed loop has not stopped yet: look again soon
        done, pending = await asyncio.wait(
            pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:
            task.result()  # a bug in a worker should surface, not vanish
