"""The gateway's waiting room: per priority class, with aging, per-class budgets and tenant
fair shares inside each class.

A class is served when its oldest request is the most urgent of all classes' oldest (it has
waited the longest, so it has aged the most and arrived first); which of the class's
requests then takes the slot is decided by the tenants' fair turns (`fair.FairClass`). That
keeps `pop` and `expired` at O(number of classes) whatever the queue length. Removal (the
client went away) is O(1): it flags the ticket, and flagged tickets are skipped when they
reach a head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

from servepilot.core.config import AdmissionConfig, Priority
from servepilot.routing.admission.fair import FairClass

T = TypeVar("T")

NUM_CLASSES = len(Priority)

SHARED_TENANT = ""
"""The tenant every request belongs to while fair shares are off (one FIFO per class)."""


def check_priority(priority: int) -> int:
    """`priority` if it names a class (0 = P0 ... 2 = P2); ValueError otherwise."""
    if not 0 <= priority < NUM_CLASSES:
        raise ValueError(f"priority must be 0..{NUM_CLASSES - 1}, got {priority}")
    return int(priority)


class Ticket(Generic[T]):
    """The caller's handle on one queued request, to `AdmissionQueue.remove` it."""

    __slots__ = ("_arrival_s", "_item", "_priority", "_queued", "_seq", "_share", "_tenant")

    def __init__(
        self, item: T, priority: int, arrival_s: float, seq: int, tenant: str, share: str
    ) -> None:
        self._item = item
        self._priority = priority
        self._arrival_s = arrival_s
        self._seq = seq
        self._tenant = tenant
        self._share = share
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
    def tenant(self) -> str:
        return self._tenant

    @property
    def share(self) -> str:
        """Whose fair share it waits in: its tenant, or `SHARED_TENANT` while fair shares are
        off."""
        return self._share

    @property
    def queued(self) -> bool:
        """Whether the request still waits (not popped, expired or removed)."""
        return self._queued


class AdmissionQueue(Generic[T]):
    """Requests waiting for a replica slot, per class, most urgent (after aging) first.

    A request's effective class is `max(0, priority - floor(wait_s / aging_s))`; the class
    served next is the one whose oldest request has the lowest effective class, the earliest
    arrival among equals. Inside it, tenants take weighted fair turns (`weights`, 1.0 for a
    tenant not named; `fair=False`: one FIFO, whoever the tenant). Each request may wait at
    most its own class's budget (`queue_budget_ms[priority]`, aging does not extend or
    shorten it); `expired` hands back the ones past it.
    """

    def __init__(
        self,
        aging_s: float,
        queue_budget_ms: Sequence[float],
        weights: Mapping[str, float] | None = None,
        *,
        fair: bool = True,
    ) -> None:
        if aging_s <= 0:
            raise ValueError("aging_s must be > 0")
        if len(queue_budget_ms) != NUM_CLASSES or any(b <= 0 for b in queue_budget_ms):
            raise ValueError(f"queue_budget_ms needs {NUM_CLASSES} budgets > 0")
        weights = dict(weights or {})
        if any(w <= 0 for w in weights.values()):
            raise ValueError("tenant weights must be > 0")
        self._aging_s = aging_s
        self._budget_s = tuple(budget / 1000.0 for budget in queue_budget_ms)
        self._fair = fair
        # Quanta in units of the smallest weight: every turn serves at least one request.
        smallest = min([1.0, *weights.values()])
        self._quanta = {tenant: w / smallest for tenant, w in weights.items()}
        self._default_quantum = 1.0 / smallest
        self._classes: tuple[FairClass[Ticket[T]], ...] = tuple(
            FairClass(self._quantum) for _ in range(NUM_CLASSES)
        )
        self._live = [0] * NUM_CLASSES
        self._depth = 0
        """sum(_live), kept: the gateway asks for it on every release."""
        self._seq = 0
        self._last_push_s = -math.inf

    @classmethod
    def from_config(cls, config: AdmissionConfig) -> AdmissionQueue[T]:
        return cls(
            config.aging_s, config.queue_budget_ms, config.tenant_weights, fair=config.fair_shares
        )

    def push(self, item: T, priority: int, now_s: float, tenant: str = SHARED_TENANT) -> Ticket[T]:
        """Queue `item` in `tenant`'s share; keep the ticket to remove it if its client goes
        away."""
        cls_ = check_priority(priority)
        # Head-only scans rely on arrivals being in order within a class; a clock that steps
        # back (it should not) is clamped rather than allowed to break that.
        arrival_s = max(now_s, self._last_push_s)
        self._last_push_s = arrival_s
        share = tenant if self._fair else SHARED_TENANT
        ticket = Ticket(item, cls_, arrival_s, self._seq, tenant, share)
        self._seq += 1
        self._classes[cls_].push(ticket)
        self._live[cls_] += 1
        self._depth += 1
        return ticket

    def remove(self, ticket: Ticket[T]) -> bool:
        """Drop a queued request; False if it had already left (popped, expired, removed)."""
        if not ticket.queued:
            return False
        ticket._queued = False
        cls_ = ticket.priority
        self._classes[cls_].removed(ticket)
        self._live[cls_] -= 1
        self._depth -= 1
        return True

    def pop(self, now_s: float) -> T | None:
        """The next request to dispatch, or None when nothing waits."""
        cls_ = self._best_class(now_s)
        if cls_ < 0:
            return None
        ticket = self._classes[cls_].next()
        assert ticket is not None
        self._take(ticket)
        return ticket.item

    def pop_if(self, now_s: float, take: Callable[[T, float], bool]) -> bool:
        """Offer the next request to `take(item, now_s)` and remove it if taken; False when
        nothing waits or `take` declined (it keeps its place).

        `pop` for a caller that can place the head only under conditions (a free replica for
        its model): popping it and pushing it back would put it behind its class and orphan
        the ticket its client holds. `take` must not change the queue.
        """
        cls_ = self._best_class(now_s)
        if cls_ < 0:
            return False
        ticket = self._classes[cls_].next()
        assert ticket is not None
        if not take(ticket.item, now_s):
            return False
        self._take(ticket)
        return True

    def in_order(self, now_s: float) -> list[Ticket[T]]:
        """Every queued request's ticket in dispatch order (O(n log n): for the rare case
        where the head cannot be served and the ones behind it might).

        Inside a class the fair turns fill the class's places in arrival order: the k-th
        request the turns serve goes when the class's k-th oldest would have."""
        keyed: list[tuple[tuple[int, float, int], Ticket[T]]] = []
        for fair in self._classes:
            places = [t for t in fair.order.items if t.queued]
            for place, ticket in zip(places, fair.fair_order(), strict=True):
                keyed.append(
                    ((self._effective_class(place, now_s), place.arrival_s, place._seq), ticket)
                )
        keyed.sort(key=lambda pair: pair[0])
        return [ticket for _, ticket in keyed]

    def expired(self, now_s: float) -> list[T]:
        """Remove and return the requests that have waited longer than their class's budget."""
        out: list[T] = []
        for cls_ in range(NUM_CLASSES):
            budget_s = self._budget_s[cls_]
            fair = self._classes[cls_]
            oldest = fair.oldest()
            while oldest is not None and now_s - oldest.arrival_s > budget_s:
                oldest._queued = False
                fair.take_oldest(oldest)
                self._live[cls_] -= 1
                self._depth -= 1
                out.append(oldest.item)
                oldest = fair.oldest()
        return out

    def ahead_of(self, priority: int, tenant: str = SHARED_TENANT) -> int:
        """Queued requests that go before a new one of `priority` and `tenant`: every one of
        the more urgent classes, and those the fair turns serve first in its own (all of
        its class while fair shares are off)."""
        cls_ = check_priority(priority)
        ahead = sum(self._live[:cls_])
        if not self._fair:
            return ahead + self._live[cls_]
        return ahead + self._classes[cls_].ahead_of(tenant)

    def victim_for(self, tenant: str, priority: int, max_queued: int) -> Ticket[T] | None:
        """The request a full queue of `max_queued` places pushes out to make room for a
        new one of `tenant` and `priority`, when that tenant holds less than its weighted
        share of the places (the tenants with requests waiting and it sharing them): the
        newest of the least urgent class, never more urgent than the newcomer, of the
        tenant most over its share. None: no room (or fair shares are off)."""
        if not self._fair:
            return None
        held = self.depth_by_tenant()
        held.setdefault(tenant, 0)
        quanta = 0.0  # a float sum: compiled, sum() of floats would start from an int
        for other in held:
            quanta += self._quantum(other)
        places_per_quantum = max_queued / quanta
        if held[tenant] >= places_per_quantum * self._quantum(tenant):
            return None
        victim: Ticket[T] | None = None
        most = places_per_quantum
        for other, count in held.items():
            over = count / self._quantum(other)
            if other == tenant or over <= most:
                continue
            for fair in reversed(self._classes[check_priority(priority) :]):
                ticket = fair.newest_of(other)
                if ticket is not None:
                    victim, most = ticket, over
                    break
        return victim

    def depth(self) -> int:
        return self._depth

    def __len__(self) -> int:
        return self._depth

    def depth_by_class(self) -> tuple[int, int, int]:
        p0, p1, p2 = self._live
        return (p0, p1, p2)

    def depth_by_tenant(self) -> dict[str, int]:
        """Requests waiting per tenant, all classes together (tenants with none are absent)."""
        out: dict[str, int] = {}
        for fair in self._classes:
            if self._fair:
                for tenant, count in fair.shares():
                    out[tenant] = out.get(tenant, 0) + count
            else:  # one share per class: count the tickets (a scrape's cost, not a request's)
                for ticket in fair.order.items:
                    if ticket.queued:
                        out[ticket.tenant] = out.get(ticket.tenant, 0) + 1
        return out

    def oldest_wait_s(self, now_s: float) -> float:
        """How long the longest-waiting request has waited (0.0 when empty)."""
        heads = [h for h in (fair.oldest() for fair in self._classes) if h is not None]
        if not heads:
            return 0.0
        return max(0.0, now_s - min(h.arrival_s for h in heads))

    def held(self) -> int:
        """Entries held in memory, removed ones not yet reclaimed and tenants included (for
        tests/metrics)."""
        return sum(fair.held() for fair in self._classes)

    def _quantum(self, tenant: str) -> float:
        return self._quanta.get(tenant, self._default_quantum)

    def _best_class(self, now_s: float) -> int:
        """The class served next (-1 when nothing waits)."""
        best = -1
        best_key: tuple[int, float, int] | None = None
        live = self._live
        for cls_ in range(NUM_CLASSES):
            if not live[cls_]:
                continue
            head = self._classes[cls_].oldest()
            if head is None:
                continue
            key = (self._effective_class(head, now_s), head.arrival_s, head._seq)
            if best_key is None or key < best_key:
                best, best_key = cls_, key
        return best

    def _effective_class(self, ticket: Ticket[T], now_s: float) -> int:
        promoted = math.floor(max(0.0, now_s - ticket.arrival_s) / self._aging_s)
        return max(0, ticket.priority - promoted)

    def _take(self, ticket: Ticket[T]) -> None:
        ticket._queued = False
        cls_ = ticket.priority
        self._classes[cls_].take(ticket)
        self._live[cls_] -= 1
        self._depth -= 1
