"""Weighted fair shares between tenants inside one priority class: deficit round robin.

A class holds one FIFO per tenant with requests waiting, and a ring of those tenants. The
tenant whose turn it is serves requests while its deficit covers them (one request costs
1.0); when it cannot, the turn passes to the next tenant, whose deficit grows by its
quantum (its weight, scaled so that the smallest weight is 1.0: every turn serves at least
one request). A tenant whose FIFO empties leaves the ring and is forgotten, deficit and all,
so an idle tenant holds no state and a returning one earns no credit for its absence
(Shreedhar and Varghese, "Efficient fair queueing using deficit round robin", 1995).

With weights 3:1 and both tenants backlogged, three of the first tenant's requests go for
every one of the second's, whatever the order they arrived in. With a single tenant the
class is one FIFO, as it was before tenants existed.

The class also keeps its tickets in arrival order: the oldest waiting request decides when
the class is served (its aging, its arrival) and is the first to pass the class's queue
budget; the fair turn decides whose request takes the slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

# Deficits are sums of float quanta; without slack 0.9999999999999998 would skip a turn.
_EPSILON = 1e-9

# Removed tickets left inside a FIFO are dropped in one pass once they outnumber the live ones
# (and are at least this many), so memory stays proportional to what is really queued while
# each removal still costs O(1) amortised.
COMPACT_MIN_DEAD = 64


class Queued(Protocol):
    """What a class needs of a ticket."""

    @property
    def queued(self) -> bool: ...

    @property
    def share(self) -> str:
        """The tenant whose turns it waits for."""
        ...


Q = TypeVar("Q", bound=Queued)


class LazyFifo(Generic[Q]):
    """A FIFO whose entries may leave from the middle: they are flagged (no longer `queued`)
    and skipped when they reach the head, or dropped together by `compact`."""

    __slots__ = ("dead", "items")

    def __init__(self) -> None:
        self.items: deque[Q] = deque()
        self.dead = 0
        """Entries in `items` that are no longer queued."""

    def head(self) -> Q | None:
        items = self.items
        while items and not items[0].queued:
            items.popleft()
            self.dead -= 1
        return items[0] if items else None

    def live(self) -> int:
        return len(self.items) - self.dead

    def newest(self) -> Q | None:
        """The entry still queued that came last."""
        for item in reversed(self.items):
            if item.queued:
                return item
        return None

    def pop_head(self, item: Q) -> None:
        """Remove `item`, the first entry still queued until a moment ago."""
        items = self.items
        while items[0] is not item:
            items.popleft()
            self.dead -= 1
        items.popleft()
        if self.dead and len(items) == self.dead:  # only removed entries are left
            items.clear()
            self.dead = 0

    def left_middle(self) -> None:
        """An entry left from somewhere other than the head."""
        self.dead += 1
        live = len(self.items) - self.dead
        if live == 0:
            self.items.clear()
            self.dead = 0
        elif self.dead >= COMPACT_MIN_DEAD and self.dead > live:
            waiting = [item for item in self.items if item.queued]
            self.items.clear()
            self.items.extend(waiting)
            self.dead = 0


class _Tenant(Generic[Q]):
    __slots__ = ("deficit", "fifo", "name", "quantum")

    def __init__(self, name: str, quantum: float) -> None:
        self.name = name
        self.quantum = quantum
        self.fifo: LazyFifo[Q] = LazyFifo()
        self.deficit = 0.0


class FairClass(Generic[Q]):
    """One priority class's waiting requests, served in weighted fair turns by tenant.

    `quantum_of(tenant)` is the tenant's weight scaled so the smallest is 1.0 (>= 1.0).
    A ticket leaves in one of three ways (`take`, `take_oldest`, `removed`); the caller
    flags it as no longer queued first.
    """

    def __init__(self, quantum_of: Callable[[str], float]) -> None:
        self._quantum_of = quantum_of
        self.order: LazyFifo[Q] = LazyFifo()
        """Every waiting ticket, oldest first."""
        self._tenants: dict[str, _Tenant[Q]] = {}
        self._ring: deque[_Tenant[Q]] = deque()
        """The tenants with requests waiting; the first one's turn is now (or next)."""
        self._started = False
        """Whether the first tenant's turn has begun (its quantum added to its deficit)."""

    def __len__(self) -> int:
        return self.order.live()

    def push(self, ticket: Q) -> None:
        self.order.items.append(ticket)
        tenant = self._tenants.get(ticket.share)
        if tenant is None:
            tenant = _Tenant(ticket.share, self._quantum_of(ticket.share))
            self._tenants[ticket.share] = tenant
            self._ring.append(tenant)
        tenant.fifo.items.append(ticket)

    def oldest(self) -> Q | None:
        """The request that has waited longest (its tenant's head)."""
        return self.order.head()

    def next(self) -> Q | None:
        """The request the fair turn serves next; nothing changes until `take` is called."""
        ring = self._ring
        if not ring:
            return None
        current = ring[0]
        if self._started and current.deficit < 1.0 - _EPSILON and len(ring) > 1:
            current = ring[1]
        return current.fifo.head()

    def take(self, ticket: Q) -> None:
        """`ticket`, the one `next` returned, was served (flagged no longer queued)."""
        ring = self._ring
        current = ring[0]
        if not self._started:
            current.deficit += current.quantum
            self._started = True
        if current.deficit < 1.0 - _EPSILON:
            ring.rotate(-1)  # the turn passes (back to the same tenant if it is alone)
            current = ring[0]
            current.deficit += current.quantum
        assert current.name == ticket.share, "take() must follow next()"
        current.deficit -= 1.0
        fifo = current.fifo
        fifo.pop_head(ticket)
        order = self.order
        if order.items and order.items[0] is ticket:  # the oldest (always, with one tenant)
            order.pop_head(ticket)
        else:
            order.left_middle()
        if len(fifo.items) == fifo.dead:
            self._forget(current)

    def take_oldest(self, ticket: Q) -> None:
        """`ticket`, the one `oldest` returned, left unserved (past its budget; flagged no
        longer queued): its tenant's deficit stays."""
        self.order.pop_head(ticket)
        tenant = self._tenants[ticket.share]
        tenant.fifo.pop_head(ticket)  # the oldest of the class is its tenant's oldest
        if tenant.fifo.live() == 0:
            self._forget(tenant)

    def removed(self, ticket: Q) -> None:
        """`ticket` (flagged no longer queued) left from anywhere: its client went away."""
        self.order.left_middle()
        tenant = self._tenants[ticket.share]
        tenant.fifo.left_middle()
        if tenant.fifo.live() == 0:
            self._forget(tenant)

    def ahead_of(self, tenant: str) -> int:
        """Requests of this class served before a new one of `tenant`, if all stayed: its
        tenant's queued ones, and of every other tenant what it serves in the turns that
        take (at most all it has queued)."""
        mine = self._tenants.get(tenant)
        own = 0 if mine is None else mine.fifo.live()
        if len(self._ring) <= 1 and (mine is not None or not self._ring):
            return own
        turns = (own + 1) / (self._quantum_of(tenant) if mine is None else mine.quantum)
        ahead = own
        for other in self._ring:
            if other is not mine:
                ahead += min(other.fifo.live(), int(turns * other.quantum))
        return ahead

    def fair_order(self) -> list[Q]:
        """Every waiting request in the order the turns would serve them (O(n))."""
        queues = [(t, [x for x in t.fifo.items if x.queued]) for t in self._ring]
        deficits = [t.deficit for t in self._ring]
        started = self._started
        out: list[Q] = []
        index = 0
        positions = [0] * len(queues)
        while len(out) < len(self.order.items) - self.order.dead:
            tenant, waiting = queues[index]
            if not started:
                deficits[index] += tenant.quantum
                started = True
            while positions[index] < len(waiting) and deficits[index] >= 1.0 - _EPSILON:
                out.append(waiting[positions[index]])
                positions[index] += 1
                deficits[index] -= 1.0
            index = (index + 1) % len(queues)
            started = False
        return out

    def newest_of(self, tenant: str) -> Q | None:
        """`tenant`'s request that came last (None when it has none waiting here)."""
        mine = self._tenants.get(tenant)
        return None if mine is None else mine.fifo.newest()

    def shares(self) -> Iterator[tuple[str, int]]:
        """(tenant, requests waiting) of the tenants with requests waiting."""
        for tenant in self._ring:
            yield tenant.name, tenant.fifo.live()

    def held(self) -> int:
        """Entries held in memory (removed ones not yet reclaimed included) and tenants."""
        fifos = sum(len(t.fifo.items) for t in self._ring)
        return len(self.order.items) + fifos + len(self._tenants)

    def _forget(self, tenant: _Tenant[Q]) -> None:
        if self._ring and self._ring[0] is tenant:
            self._ring.popleft()
            self._started = False
        else:
            self._ring.remove(tenant)
        del self._tenants[tenant.name]
