"""The admission cycle the gateway and the fleet simulator both run, over this package's policies.

arrive -> decide -> dispatch or queue -> release -> pump -> tick: the driver owns the policy
state (controller, queue, hard and soft limits, dispatch rate) and the rules that step it;
its caller owns the replicas' slots (`Slots`: the gateway's pool with its breakers and models,
or the simulator's incrementally kept candidate list) and turns the decisions into asyncio
futures (gateway/dispatch.py) or events (sim/fleet/gateway.py). Time comes in as `now_s`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Final, Generic, Protocol, TypeVar

from mypy_extensions import mypyc_attr

from servepilot.core.config import GatewayConfig
from servepilot.routing.admission.decision import (
    LOWEST_CLASS,
    Admission,
    AdmissionController,
    AdmissionSnapshot,
    AdmitKind,
    Reason,
)
from servepilot.routing.admission.limits import DegradationEvent, HardLimit, SoftLimit
from servepilot.routing.admission.meter import RateMeter
from servepilot.routing.admission.queue import SHARED_TENANT, AdmissionQueue, Ticket

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

BUSY_TICK_S: Final = 0.02
"""The tick period while requests wait: how late a budget is enforced or a slot noticed."""
IDLE_TICK_S: Final = 0.5
"""The tick period while none waits: it only feeds the soft limit."""


class Slots(Protocol[T_contra]):
    """The replicas' side of the cycle, kept by the driver's caller."""

    def place(self, item: T_contra, now_s: float) -> bool:
        """Give the waiting `item` a free slot it can use (it is dispatched), or drop it if
        its client has gone: True; False: it keeps waiting (no slot it can use is free)."""
        ...

    def any_free(self) -> bool:
        """Whether any replica has a free slot (for any model)."""
        ...


@dataclass(frozen=True, slots=True)
class FleetLoad:
    """What a tick reads of the replicas behind the gateway."""

    ready_replicas: int
    starting: bool
    """Whether some replica is on its way up (never ready yet)."""
    mean_kv_usage: float
    """Scraped KV cache usage, averaged over the ready replicas."""
    engine_waiting: int
    """Requests waiting inside the engines (vLLM's num_requests_waiting, summed)."""


# A plain Python class when compiled: mypyc cannot build a generic frozen dataclass, and a
# report is made once per tick, not per request.
@mypyc_attr(native_class=False)
@dataclass(frozen=True, slots=True)
class TickReport(Generic[T]):
    """What a tick did, for the caller to act on."""

    expired: list[T]
    """Waits past their class's queue budget, taken out of the queue: refuse them (429)."""
    degradations: list[DegradationEvent]
    next_tick_s: float
    """The delay to the next tick (`BUSY_TICK_S` while requests wait, else `IDLE_TICK_S`)."""


class AdmissionDriver(Generic[T]):
    """One gateway's admission state and the steps of its cycle, for items of type T.

    `shed_share_per_tick` reads the hard limit's shed share once per tick instead of per
    lowest-class arrival (the simulator's choice: between ticks it misses the last few
    milliseconds of first-byte samples, at a fraction of the cost).
    """

    def __init__(
        self, config: GatewayConfig, rng: random.Random, *, shed_share_per_tick: bool = False
    ) -> None:
        admission = config.admission
        self.controller = AdmissionController(
            admission, config.protection, default_retry_after_s=config.retry_after_s
        )
        self.queue: AdmissionQueue[T] = AdmissionQueue.from_config(admission)
        self.hard_limit = HardLimit.from_config(config.protection)
        self.soft_limit = SoftLimit.from_config(config.protection)
        self.rate = RateMeter()
        self.kv_full_usage = admission.kv_full_usage
        self._max_queued = admission.max_queued
        self.pushed_out: list[T] = []
        """Queued requests pushed out of a full queue to make room for a tenant under its
        share (`enqueue`): the caller refuses them (429 "queue_full") and clears the list."""
        self._cold_start_wait_s = admission.cold_start_wait_s
        self._rng = rng
        self._no_replica = Admission(
            AdmitKind.UNAVAILABLE_503, Reason.NO_REPLICA, config.retry_after_s
        )
        self._per_tick = shed_share_per_tick
        self._shed_share = 0.0
        self._shed_stale = True

    # ---- arrive ------------------------------------------------------------------------------

    def decide(
        self,
        priority: int,
        free_slots: int,
        ready_replicas: int,
        starting: bool,
        now_s: float,
        tenant: str = SHARED_TENANT,
    ) -> Admission:
        """Dispatch, queue or refuse an arrival of `tenant`, given the replicas' free slots now.

        `starting` is read only when no replica is ready: with none on its way up either,
        waiting would only hide the outage (503), so cold-start buffering does not apply.
        """
        if not ready_replicas and not starting:
            return self._no_replica
        share = 0.0
        if priority == LOWEST_CLASS:
            share = self._current_shed_share()
        # AdmissionSnapshot(...) at a third of the cost: a gateway builds one per request.
        snapshot: AdmissionSnapshot = _new(AdmissionSnapshot)
        _SET_QUEUED(snapshot, self.queue.depth_by_class())
        _SET_FREE(snapshot, free_slots)
        _SET_READY(snapshot, ready_replicas)
        _SET_RATE(snapshot, self.rate.rate_per_s(now_s))
        _SET_LEVEL(snapshot, self.soft_limit.level)
        _SET_SHARE(snapshot, share)
        queue = self.queue
        queued = len(queue)
        _SET_AHEAD(snapshot, queue.ahead_of(priority, tenant) if queued else 0)
        room = queued >= self._max_queued and (
            queue.victim_for(tenant, priority, self._max_queued) is not None
        )
        _SET_ROOM(snapshot, room)
        return self.controller.admit(priority, snapshot, now_s, self._rng)

    def enqueue(
        self, item: T, priority: int, now_s: float, tenant: str = SHARED_TENANT
    ) -> Ticket[T]:
        """Queue a request the decision said to queue (or one that found no usable slot); in
        a full queue, another tenant's request may leave for it (`pushed_out`)."""
        queue = self.queue
        if len(queue) >= self._max_queued:
            victim = queue.victim_for(tenant, priority, self._max_queued)
            if victim is not None:
                queue.remove(victim)
                self.pushed_out.append(victim.item)
        return queue.push(item, priority, now_s, tenant)

    def cold_wait_s(self, decision: Admission) -> float | None:
        """How long a queued request may wait for a replica before its 503: during a cold
        start, `cold_start_wait_s`; None otherwise (its class's queue budget bounds it)."""
        return self._cold_start_wait_s if decision.reason is Reason.COLD_START else None

    def dispatched(self, now_s: float) -> None:
        """A request was given a slot (the dispatch rate queue waits are predicted from)."""
        self.rate.record(now_s)

    # ---- release and pump --------------------------------------------------------------------

    def release(self, replica_id: str, ttfb_s: float | None, now_s: float, slots: Slots[T]) -> None:
        """A request freed its slot: judge its replica's first byte (None: not judged: it
        failed, or nothing streamed), then give freed slots to waiting requests."""
        if ttfb_s is not None:
            self.hard_limit.observe(replica_id, ttfb_s * 1000.0)
        if len(self.queue):
            self.pump(now_s, slots)

    def pump(self, now_s: float, slots: Slots[T]) -> None:
        """Give free slots to the most urgent waiters, while there are both."""
        queue = self.queue
        place = slots.place
        while len(queue):
            if not queue.pop_if(now_s, place):
                # The head keeps its place until a slot it can use frees up; the ones behind
                # it (another model, other excluded replicas) may use the free slots meanwhile.
                if slots.any_free():
                    self._pump_behind(now_s, slots)
                return

    def _pump_behind(self, now_s: float, slots: Slots[T]) -> None:
        queue = self.queue
        for ticket in queue.in_order(now_s):
            if slots.place(ticket.item, now_s):
                queue.remove(ticket)

    # ---- tick ----------------------------------------------------------------------------------

    def tick(self, now_s: float, slots: Slots[T], load: FleetLoad) -> TickReport[T]:
        """The ticker's step: pump, expire waits past their budget, feed the soft limit."""
        self.pump(now_s, slots)
        expired: list[T] = []
        # During a cold start waits are bounded by `cold_wait_s` instead.
        if load.ready_replicas or not load.starting:
            expired = self.queue.expired(now_s)
        queued = len(self.queue) + load.engine_waiting
        events = self.soft_limit.update(now_s, load.mean_kv_usage, queued, load.ready_replicas)
        self._shed_stale = True
        return TickReport(expired, events, self.next_tick_s())

    def next_tick_s(self) -> float:
        return BUSY_TICK_S if len(self.queue) else IDLE_TICK_S

    def queue_retry_after_s(self, now_s: float) -> int:
        """Retry-After for a request refused from the queue: until the queue has drained."""
        return self.controller.retry_after_s(len(self.queue), self.rate.rate_per_s(now_s))

    def forget(self, replica_id: str) -> None:
        """The replica left rotation: stop judging its first bytes."""
        self.hard_limit.forget(replica_id)

    def _current_shed_share(self) -> float:
        if not self._per_tick:
            return self.hard_limit.current_shed_share()
        if self._shed_stale:
            self._shed_share = self.hard_limit.current_shed_share()
            self._shed_stale = False
        return self._shed_share


_new = object.__new__
# A frozen dataclass's __init__ sets each field through object.__setattr__ by name; its slot
# descriptors set the same fields directly (a test compares the two).
_SNAPSHOT_FIELDS = (
    "queued_by_class",
    "free_slots",
    "ready_replicas",
    "dispatch_rate_per_s",
    "degradation",
    "hard_limit_shed_share",
    "fair_ahead",
    "fair_room",
)
assert tuple(f.name for f in fields(AdmissionSnapshot)) == _SNAPSHOT_FIELDS, "fields changed"
(_SET_QUEUED, _SET_FREE, _SET_READY, _SET_RATE, _SET_LEVEL, _SET_SHARE, _SET_AHEAD, _SET_ROOM) = (
    vars(AdmissionSnapshot)[name].__set__ for name in _SNAPSHOT_FIELDS
)
