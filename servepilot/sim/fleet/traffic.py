"""What the simulated clients send: request shapes, and which of them go when.

The simulator does not import the bench package (DESIGN.md's layers); the CLI turns a bench
workload (`bench.shapes.workload_shapes`, same seeds) and its arrival schedule
(`bench.arrivals`) into the plain data here. The slot rules copy bench's driver
(`bench/drive.py`: `open_slots`, `ClosedSlots`) so that a simulated level sends what a
measured one would: slot q sends job q mod len(jobs), the first `warmup_requests` slots are
warm-up, a level stops after `max_requests` measured slots or `duration_s` from the first
measured one, and a duration-bound level gives the requests still in flight `grace_s` to
finish before they count as failed ("cancelled_at_end").
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode

NO_GROUP = -1


@dataclass(frozen=True, slots=True)
class Job:
    """One request's shape, in the tokens the server sees."""

    prompt_tokens: int
    """Everything the server prefills: prompt, chat template, conversation history."""
    output_tokens: int
    prefix_group: int | None = None
    prefix_tokens: int = 0
    """Leading tokens shared with the other jobs of `prefix_group`."""
    priority: int = 1
    session_id: str | None = None
    at_s: float | None = None
    """A trace's send time (offset from its start)."""
    routed_tokens: int | None = None
    """What the gateway estimates the prompt at (it sees the text, not the template);
    None: `prompt_tokens`."""


class JobTable:
    """Jobs in columns of machine numbers: millions of them cost bytes each, not objects."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self.prompt = array("l")
        self.output = array("l")
        self.group = array("q")
        self.prefix = array("l")
        self.priority = array("b")
        self.routed = array("l")
        sessions: list[str | None] = []
        times: list[float | None] = []
        for job in jobs:
            if job.prompt_tokens < 1 or job.output_tokens < 1:
                raise ConfigError("every request needs at least one prompt and one output token")
            self.prompt.append(job.prompt_tokens)
            self.output.append(job.output_tokens)
            self.group.append(NO_GROUP if job.prefix_group is None else job.prefix_group)
            self.prefix.append(job.prefix_tokens)
            self.priority.append(job.priority)
            self.routed.append(
                job.prompt_tokens if job.routed_tokens is None else job.routed_tokens
            )
            sessions.append(job.session_id)
            times.append(job.at_s)
        self.sessions: list[str | None] | None = (
            sessions if any(s is not None for s in sessions) else None
        )
        self.at_s: list[float] | None = None
        if times and all(t is not None for t in times):
            self.at_s = [t for t in times if t is not None]

    def __len__(self) -> int:
        return len(self.prompt)

    def job(self, index: int) -> Job:
        group = self.group[index]
        return Job(
            prompt_tokens=self.prompt[index],
            output_tokens=self.output[index],
            prefix_group=None if group == NO_GROUP else group,
            prefix_tokens=self.prefix[index],
            priority=self.priority[index],
            session_id=None if self.sessions is None else self.sessions[index],
            at_s=None if self.at_s is None else self.at_s[index],
            routed_tokens=self.routed[index],
        )


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """One load level, as bench's `LoadPlan` describes it."""

    load: Load
    max_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    grace_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_requests is None and self.duration_s is None:
            raise ConfigError("a load level needs a number of requests or a duration")
        if self.max_requests is not None and self.max_requests < 0:
            raise ConfigError(f"--requests must be at least 0, got {self.max_requests}")
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise ConfigError(f"--duration must be above 0 s, got {self.duration_s}")
        if self.warmup_requests < 0:
            raise ConfigError(f"--warmup must be at least 0, got {self.warmup_requests}")
        value = self.load.value
        if self.load.mode is LoadMode.CONCURRENCY and not (value >= 1 and value == int(value)):
            raise ConfigError(f"--concurrency must be a whole number >= 1, got {value}")
        if self.load.mode is LoadMode.RATE and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--rate must be a finite number above 0, got {value}")

    @property
    def closed(self) -> bool:
        return self.load.mode is LoadMode.CONCURRENCY


class Slot(NamedTuple):
    """One send (a tuple: millions are made, and a tuple is made fastest)."""

    job: int
    """Index into the job table."""
    send_s: float
    warmup: bool


_new_slot: Final = tuple.__new__
"""`Slot(a, b, c)` is `tuple.__new__(Slot, (a, b, c))`; called directly, without the
NamedTuple's interpreted __new__ (one per request)."""


def open_slots(plan: LevelPlan, count: int, offsets: Iterator[float]) -> Iterator[Slot]:
    """The open loop's slots on the schedule `offsets` (bench's `open_slots`, one process)."""
    measured, measure_from = 0, 0.0
    for position, offset in enumerate(offsets):
        warm = position < plan.warmup_requests
        if not warm:
            if measured == 0:
                measure_from = offset
            if plan.max_requests is not None and measured >= plan.max_requests:
                return
            if plan.duration_s is not None and offset >= measure_from + plan.duration_s:
                return
            measured += 1
        yield _new_slot(Slot, (position % count, offset, warm))


class ClosedSlots:
    """The closed loop's slots: each worker takes the next when its answer is in (bench's
    `ClosedSlots`, with the simulated clock)."""

    __slots__ = ("_count", "_plan", "end_s", "measured", "position", "stopped")

    def __init__(self, plan: LevelPlan, count: int) -> None:
        self._plan = plan
        self._count = count
        self.position = 0
        self.measured = 0
        self.stopped = False
        self.end_s: float | None = None
        """When a duration-bound level stops handing out slots (known from its first
        measured slot on)."""

    def next(self, now_s: float) -> Slot | None:
        """The slot a worker free at `now_s` sends, or None once the level is over."""
        if self.stopped:
            return None
        plan = self._plan
        warm = self.position < plan.warmup_requests
        if not warm:
            if self.end_s is None and plan.duration_s is not None:
                self.end_s = now_s + plan.duration_s
            quota = plan.max_requests
            if (quota is not None and self.measured >= quota) or (
                self.end_s is not None and now_s >= self.end_s
            ):
                self.stopped = True
                return None
            self.measured += 1
        slot = _new_slot(Slot, (self.position % self._count, now_s, warm))
        self.position += 1
        return slot


def trace_offsets(times: list[float]) -> Iterator[float]:
    """A trace's own send times, repeated (shifted by its span plus one mean gap) when a
    level needs more (bench's `_trace_offsets`)."""
    span = max(times) - min(times)
    period = span + (span / (len(times) - 1) if len(times) > 1 else 1.0)
    cycle = 0
    while True:
        for t in times:
            yield t + cycle * period
        cycle += 1
