"""Runs the lines of active batches on the capacity interactive traffic leaves idle.

One loop owns everything: it ends batches that are due (expired, cancelled, all lines done),
and starts pending lines, earliest deadline first, while the AIMD window has room. Each line
is a task of the loop's, sent at priority 2 through the gateway's admission; a 429 or 503
(admission stepping aside) puts it back for later and cuts the window, a 2xx or a final
error commits its result. Shutdown stops the loop, lets the lines in flight finish within
the drain timeout and cancels the rest: those stay pending and are sent again on the next
start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from servepilot.core.config import BatchConfig
from servepilot.core.loop import cancel_and_wait
from servepilot.gateway.batch.aimd import AimdWindow
from servepilot.gateway.batch.exchange import Answer
from servepilot.gateway.batch.jobs import (
    ActiveBatch,
    JobStore,
    PendingLine,
    Status,
    error_line,
    result_line,
)

log = logging.getLogger(__name__)

Send = Callable[[str, bytes], Awaitable[Answer]]
_IDLE_S = 0.5  # the loop's longest sleep (a deadline can pass without any event)
_STEP_ASIDE = (429, 503)
_REPLICA_FAILED = (0, 502, 504)
_HOLD_S = 0.5  # a line that was shed waits this long before it is tried again


@dataclass(frozen=True, slots=True)
class FleetRoom:
    """What the scheduler reads of the gateway before starting lines."""

    interactive_waiting: int
    """P0 and P1 requests queued at the gateway."""
    batch_waiting: int
    """P2 requests queued at the gateway: lines already sent that will take a free slot."""
    free_slots: int
    total_slots: int

    def batch_room(self, reserve_share: float) -> int:
        """More lines that may be sent now: the free slots beyond the interactive reserve,
        less those the lines already waiting for one will take."""
        reserve = math.ceil(reserve_share * self.total_slots)
        return self.free_slots - self.batch_waiting - reserve


class BatchScheduler:
    def __init__(
        self,
        jobs: JobStore,
        send: Send,
        config: BatchConfig,
        room: Callable[[], FleetRoom],
    ) -> None:
        self._jobs = jobs
        self._send = send
        self._config = config
        self._room = room
        self._clock = jobs.clock
        self.window = AimdWindow(config.max_concurrency)
        self._in_flight: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._held: dict[tuple[str, int], float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.outcomes = dict.fromkeys(("completed", "failed", "stepped_aside", "retried"), 0)
        """Line answers since start, by what became of them (the metrics' counts)."""

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="batch")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self, drain_timeout_s: float = 0.0) -> None:
        """The loop first (it starts lines), then the lines it started: those that finish
        within `drain_timeout_s` are committed, the others cancelled."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        lines = list(self._in_flight.values())
        if lines and drain_timeout_s > 0:
            await asyncio.wait(lines, timeout=drain_timeout_s)
        for line in lines:
            line.cancel()
        await asyncio.gather(*lines, return_exceptions=True)
        self._in_flight.clear()

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # a bug (or a full disk) must not end batch work for good
                log.exception("batch scheduler step failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_IDLE_S):
                    await self._wake.wait()
            self._wake.clear()

    async def step(self) -> None:
        """End what is due, then start what the window allows."""
        if not self._jobs.claim():
            return
        now = self._clock()
        for batch in await self._jobs.active():
            if not await self._maybe_end(batch, now):
                await self._fill(batch, now)

    async def _maybe_end(self, batch: ActiveBatch, now: float) -> bool:
        """End `batch` if it is due; True when it takes no more lines."""
        running = any(key[0] == batch.batch_id for key in self._in_flight)
        if batch.status is Status.IN_PROGRESS and now >= batch.expires_at:
            await self._end(batch, Status.EXPIRED, "batch_expired")
            log.info("batch %s expired with %d lines not run", batch.batch_id, batch.pending)
        elif batch.status is Status.CANCELLING:
            await self._end(batch, Status.CANCELLED, None)
        elif batch.status is Status.FINALIZING or (batch.pending == 0 and not running):
            await self._jobs.set_finalizing(batch.batch_id)
            await self._end(batch, Status.COMPLETED, None)
        else:
            return False
        return True

    async def _give_up_after_attempts(self, line: PendingLine, exc: Exception) -> None:
        if line.attempts + 1 < self._config.max_attempts:
            await self._jobs.count_attempt(line)
            return
        self.outcomes["failed"] += 1
        message = f"the gateway failed to run this request: {exc}"
        await self._jobs.commit(line, False, error_line(line.custom_id, "internal_error", message))

    async def _end(self, batch: ActiveBatch, end: Status, unfinished_code: str | None) -> None:
        running = [key for key in self._in_flight if key[0] == batch.batch_id]
        await self._cancel_lines(running)
        await self._jobs.finish(batch.batch_id, end, unfinished_code)
        for key in [key for key in self._held if key[0] == batch.batch_id]:
            del self._held[key]

    async def _cancel_lines(self, keys: list[tuple[str, int]]) -> None:
        tasks = [self._in_flight.pop(key) for key in keys]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _fill(self, batch: ActiveBatch, now: float) -> None:
        fleet = self._room()
        self.window.on_interactive_queue(fleet.interactive_waiting)
        room = min(self.window.limit - len(self._in_flight),
                   fleet.batch_room(self._config.reserve_share))  # fmt: skip
        if room <= 0:
            return
        skip = {i for (b, i) in self._in_flight if b == batch.batch_id}
        skip |= {i for (b, i), until in self._held.items() if b == batch.batch_id and until > now}
        for line in await self._jobs.pending(batch.batch_id, room, skip):
            key = (line.batch_id, line.index)
            self._held.pop(key, None)
            task = asyncio.get_running_loop().create_task(self._line(line, batch.endpoint))
            self._in_flight[key] = task

    async def _line(self, line: PendingLine, endpoint: str) -> None:
        key = (line.batch_id, line.index)
        try:
            answer = await self._send(endpoint, line.body.encode())
            if answer.status in _STEP_ASIDE:
                self.window.on_pushback()
                self._held[key] = self._clock() + _HOLD_S
                self.outcomes["stepped_aside"] += 1
            elif answer.status in _REPLICA_FAILED and line.attempts + 1 < self._config.max_attempts:
                self.window.on_pushback()
                self.outcomes["retried"] += 1
                await self._jobs.count_attempt(line)
            else:
                ok = 200 <= answer.status < 300
                self.outcomes["completed" if ok else "failed"] += 1
                if ok:
                    self.window.on_success()
                elif answer.status >= 500:
                    self.window.on_pushback()
                result = result_line(line.custom_id, answer.status, answer.body)
                await self._jobs.commit(line, ok, result)
        except Exception as exc:  # a bug: tried again, but never forever
            log.exception("batch line %s of %s failed", line.custom_id, line.batch_id)
            await self._give_up_after_attempts(line, exc)
        finally:
            self._in_flight.pop(key, None)
            self._wake.set()
