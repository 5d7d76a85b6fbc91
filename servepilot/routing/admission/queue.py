"""The gateway's waiting room: one FIFO per priority class, with aging and per-class budgets.

Only the head of each class's FIFO can be the best candidate of its class (it has waited the
longest, so it has aged the most and arrived first), which keeps `pop` and `expired` at
O(number of classes) whatever the queue length. Removal (the client went away) is O(1): it
flags the ticket, and flagged tickets are skipped when they reach a head.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from servepilot.core.config import AdmissionConfig, Priority

T = TypeVar("T")

NUM_CLASSES = len(Priority)

# Removed tickets left inside a FIFO are dropped in one pass once they outnumber the live ones
# (and are at least this many), so memory stays proportional to what is really queued while
# each removal still costs O(1) amortised.
_COMPACT_MIN_DEAD = 64


def check_priority(priority: int) -> int:
    """`priority` if it names a class (0 = P0 ... 2 = P2); ValueError otherwise."""
    if not 0 <= priority < NUM_CLASSES:
        raise ValueError(f"priority must be 0..{NUM_CLASSES - 1}, got {priority}")
    return int(priority)


class Ticket(Generic[T]):
    """The caller's handle on one queued request, to `AdmissionQueue.remove` it."""

    __slots__ = ("_arrival_s", "_item", "_priority", "_queued", "_seq")

    def __init__(self, item: T, priority: int, arrival_s: float, seq: int) -> None:
        self._item = item
        self._priority = priority
        self._arrival_s = arrival_s
        self._seq = seq
        self._queued = True

    @property
    def item(self) -> T:
        return self._item

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def arrival_s(self) -> float:
        return self._arrival_s

    @property
    def queued(self) -> bool:
        """Whether the request still waits (not popped, expired or removed)."""
        return self._queued


class AdmissionQueue(Generic[T]):
    """Requests waiting for a replica slot, per class, most urgent (after aging) first.

    A request's effective class is `max(0, priority - floor(wait_s / aging_s))`; the next one
    out has the lowest effective class, the earliest arrival among equals. Each request may
    wait at most its own class's budget (`queue_budget_ms[priority]`, aging does not extend
    or shorten it); `expired` hands back the ones past it.
    """

    def __init__(self, aging_s: float, queue_budget_ms: Sequence[float]) -> None:
        if aging_s <= 0:
            raise ValueError("aging_s must be > 0")
        if len(queue_budget_ms) != NUM_CLASSES or any(b <= 0 for b in queue_budget_ms):
            raise ValueError(f"queue_budget_ms needs {NUM_CLASSES} budgets > 0")
        self._aging_s = aging_s
        self._budget_s = tuple(budget / 1000.0 for budget in queue_budget_ms)
        self._fifos: tuple[deque[Ticket[T]], ...] = tuple(deque() for _ in range(NUM_CLASSES))
        self._live = [0] * NUM_CLASSES
        self._depth = 0
        """sum(_live), kept: the gateway asks for it on every release."""
        self._dead = [0] * NUM_CLASSES
        self._seq = 0
        self._last_push_s = -math.inf

    @classmethod
    def from_config(cls, config: AdmissionConfig) -> AdmissionQueue[T]:
        return cls(config.aging_s, config.queue_budget_ms)

    def push(self, item: T, priority: int, now_s: float) -> Ticket[T]:
        """Queue `item`; keep the ticket to remove it if its client goes away."""
        cls_ = check_priority(priority)
        # Head-only scans rely on arrivals being in order within a FIFO; a clock that steps
        # back (it should not) is clamped rather than allowed to break that.
        arrival_s = max(now_s, self._last_push_s)
        self._last_push_s = arrival_s
        ticket = Ticket(item, cls_, arrival_s, self._seq)
        self._seq += 1
        self._fifos[cls_].append(ticket)
        self._live[cls_] += 1
        self._depth += 1
        return ticket

    def remove(self, ticket: Ticket[T]) -> bool:
        """Drop a queued request; False if it had already left (popped, expired, removed)."""
        if not ticket.queued:
            return False
        ticket._queued = False
        cls_ = ticket.priority
        self._live[cls_] -= 1
        self._depth -= 1
        self._dead[cls_] += 1
        self._reclaim(cls_)
        return True

    def pop(self, now_s: float) -> T | None:
        """The next request to dispatch, or None when nothing waits."""
        best = self._best(now_s)
        if best is None:
            return None
        self._take_head(best.priority)
        return best.item

    def pop_if(self, now_s: float, take: Callable[[T, float], bool]) -> bool:
        """Offer the next request to `take(item, now_s)` and remove it if taken; False when
        nothing waits or `take` declined (it keeps its place).

        `pop` for a caller that can place the head only under conditions (a free replica for
        its model): popping it and pushing it back would put it behind its class and orphan
        the ticket its client holds. `take` must not change the queue.
        """
        best = self._best(now_s)
        if best is None or not take(best.item, now_s):
            return False
        self._take_head(best.priority)
        return True

    def in_order(self, now_s: float) -> list[Ticket[T]]:
        """Every queued request's ticket in dispatch order (O(n log n): for the rare case
        where the head cannot be served and the ones behind it might)."""
        live = [ticket for fifo in self._fifos for ticket in fifo if ticket.queued]
        live.sort(key=lambda t: (self._effective_class(t, now_s), t.arrival_s, t._seq))
        return live

    def expired(self, now_s: float) -> list[T]:
        """Remove and return the requests that have waited longer than their class's budget."""
        out: list[T] = []
        for cls_ in range(NUM_CLASSES):
            budget_s = self._budget_s[cls_]
            head = self._head(cls_)
            while head is not None and now_s - head.arrival_s > budget_s:
                out.append(self._take_head(cls_).item)
                head = self._head(cls_)
        return out

    def depth(self) -> int:
        return self._depth

    def __len__(self) -> int:
        return self._depth

    def depth_by_class(self) -> tuple[int, int, int]:
        p0, p1, p2 = self._live
        return (p0, p1, p2)

    def oldest_wait_s(self, now_s: float) -> float:
        """How long the longest-waiting request has waited (0.0 when empty)."""
        heads = [h for h in (self._head(c) for c in range(NUM_CLASSES)) if h is not None]
        if not heads:
            return 0.0
        return max(0.0, now_s - min(h.arrival_s for h in heads))

    def _best(self, now_s: float) -> Ticket[T] | None:
        best: Ticket[T] | None = None
        best_key: tuple[int, float, int] | None = None
        for cls_ in range(NUM_CLASSES):
            head = self._head(cls_)
            if head is None:
                continue
            key = (self._effective_class(head, now_s), head.arrival_s, head._seq)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def _effective_class(self, ticket: Ticket[T], now_s: float) -> int:
        promoted = math.floor(max(0.0, now_s - ticket.arrival_s) / self._aging_s)
        return max(0, ticket.priority - promoted)

    def _head(self, cls_: int) -> Ticket[T] | None:
        fifo = self._fifos[cls_]
        while fifo and not fifo[0].queued:
            fifo.popleft()
            self._dead[cls_] -= 1
        return fifo[0] if fifo else None

    def _take_head(self, cls_: int) -> Ticket[T]:
        ticket = self._fifos[cls_].popleft()
        ticket._queued = False
        self._live[cls_] -= 1
        self._depth -= 1
        self._reclaim(cls_)
        return ticket

    def _reclaim(self, cls_: int) -> None:
        """Free the memory held by removed tickets when it is cheap to do so."""
        dead = self._dead[cls_]
        if dead == 0:
            return
        fifo = self._fifos[cls_]
        if self._live[cls_] == 0:
            fifo.clear()
            self._dead[cls_] = 0
        elif dead >= _COMPACT_MIN_DEAD and dead > self._live[cls_]:
            waiting = [t for t in fifo if t.queued]
            fifo.clear()
            fifo.extend(waiting)
            self._dead[cls_] = 0

    def held(self) -> int:
        """Tickets held in memory, removed ones not yet reclaimed included (for tests/metrics)."""
        return sum(len(fifo) for fifo in self._fifos)
