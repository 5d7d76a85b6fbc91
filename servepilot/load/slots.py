"""Which request goes when: a load level's slots, one copy for bench's clients and sim's.

A level is a sequence of slots (global positions 0, 1, 2, ...); slot q sends request
q mod len(requests). The first `warmup_requests` slots (and every slot due within the first
`warmup_s`) are warm-up; a level stops after `max_requests` measured slots, or `duration_s`
after its first measured one. The open loop's slots are decided before the run from the
schedule (`send_times`); the closed loop's as each worker's answer comes in (`ClosedSlots`).

With several client processes, process p of P takes the slots q with q mod P == p, and its
share of the closed loop's concurrency (`concurrency_share`); every process computes the same
global schedule from the same seed, so no coordination is needed while the load runs. The
simulator is one process (part 0 of 1).

Speed: the simulator asks for one slot per simulated request (millions), so a slot is a
plain tuple made by `tuple.__new__` and the rules read the plan's fields once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

from servepilot.load.arrivals import iter_arrival_offsets_s
from servepilot.load.loadplan import LoadPlan


class Slot(NamedTuple):
    """One send."""

    request: int
    """Position in the level's request list."""
    send_s: float
    """Open loop: the scheduled send time. Closed loop: when the worker asked for the slot."""
    warmup: bool


_new_slot: Final = tuple.__new__
"""`Slot(a, b, c)` is `tuple.__new__(Slot, (a, b, c))`; called directly, without the
NamedTuple's interpreted __new__ (one per request)."""


def concurrency_share(concurrency: int, part: int, parts: int) -> int:
    return concurrency // parts + (1 if part < concurrency % parts else 0)


def open_slots(
    plan: LoadPlan, count: int, offsets: Iterator[float], part: int = 0, parts: int = 1
) -> Iterator[Slot]:
    """The open loop's slots of process `part`, on the schedule `offsets`."""
    warmup_requests, warmup_s = plan.warmup_requests, plan.warmup_s
    max_requests, duration_s = plan.max_requests, plan.duration_s
    measured, measure_from = 0, 0.0
    for position, offset in enumerate(offsets):
        warm = position < warmup_requests or offset < warmup_s
        if not warm:
            if measured == 0:
                measure_from = offset
            if max_requests is not None and measured >= max_requests:
                return
            if duration_s is not None and offset >= measure_from + duration_s:
                return
            measured += 1
        if position % parts == part:
            yield _new_slot(Slot, (position % count, offset, warm))


class ClosedSlots:
    """The closed loop's slots of process `part`: each worker takes the next when its answer
    is in; the clock (`now_s`) decides warm-up by time and the end. `load.sessions` counts
    the agentic workload's turns with it too."""

    __slots__ = ("_count", "_parts", "_plan", "end_s", "measured", "position", "quota", "stopped")

    def __init__(self, plan: LoadPlan, count: int, part: int = 0, parts: int = 1) -> None:
        self._plan = plan
        self._count = count
        self._parts = parts
        self.quota = (
            None if plan.max_requests is None else len(range(part, plan.max_requests, parts))
        )
        self.position = part
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
        # A process may read its clock a hair before the shared start (now_s < 0): that is
        # no warm-up unless one by time was asked for.
        warm = self.position < plan.warmup_requests or (plan.warmup_s > 0 and now_s < plan.warmup_s)
        if not warm:
            if self.end_s is None and plan.duration_s is not None:
                self.end_s = now_s + plan.duration_s
            quota = self.quota
            if quota is not None and self.measured >= quota:
                self.stopped = True
                return None
            if self.end_s is not None and now_s >= self.end_s:
                # Not `stopped`: a caller whose times are not in order (agentic sessions ask
                # for a turn due a wait after its answer: load.sessions) may still ask for one
                # due earlier. Workers asking at their own `now` never do.
                return None
            self.measured += 1
        slot = _new_slot(Slot, (self.position % self._count, now_s, warm))
        self.position += self._parts
        return slot


def replay_times(at_s: Sequence[float | None]) -> list[float] | None:
    """The requests' own send times when every one has one (a trace), else None."""
    if not at_s or any(t is None for t in at_s):
        return None
    return [t for t in at_s if t is not None]


def send_times(plan: LoadPlan, replay: Sequence[float] | None) -> Iterator[float]:
    """The open loop's schedule: a trace's own times (`replay`), else the plan's arrivals."""
    if replay is not None:
        return trace_offsets(replay)
    return iter_arrival_offsets_s(
        plan.load.value, plan.arrival, burstiness=plan.burstiness, seed=plan.seed
    )


def trace_offsets(times: Sequence[float]) -> Iterator[float]:
    """A trace's own send times; repeated (shifted by its span plus one mean gap) when a
    level needs more."""
    span = max(times) - min(times)
    period = span + (span / (len(times) - 1) if len(times) > 1 else 1.0)
    cycle = 0
    while True:
        for t in times:
            yield t + cycle * period
        cycle += 1
