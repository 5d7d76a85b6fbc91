"""What happens to a request when it arrives: dispatch it, queue it, or refuse it (429/503).

The decision is a function of the request's class, a snapshot of the gateway's state and an
injected RNG, so the gateway and the fleet simulator take the same decisions from the same
state.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from servepilot.core.config import AdmissionConfig, Priority, ProtectionConfig
from servepilot.routing.admission.limits import DegradationLevel
from servepilot.routing.admission.queue import check_priority
from servepilot.routing.base import ReplicaView

LOWEST_CLASS = max(Priority)


class AdmitKind(enum.StrEnum):
    DISPATCH = "dispatch"
    """Send it to a replica now."""
    QUEUE = "queue"
    """Put it in the admission queue."""
    SHED_429 = "shed_429"
    """Refuse it with 429 Too Many Requests and Retry-After."""
    UNAVAILABLE_503 = "unavailable_503"
    """Refuse it with 503 Service Unavailable and Retry-After."""


class Reason(enum.StrEnum):
    """Why: for the log line and the metric label."""

    FREE_SLOT = "free_slot"
    QUEUED = "queued"
    COLD_START = "cold_start"
    NO_REPLICA = "no_replica"
    DEGRADED = "degraded"
    HARD_LIMIT = "hard_limit"
    QUEUE_FULL = "queue_full"
    QUEUE_BUDGET = "queue_budget"


# A plain Python class when compiled: the simulator builds snapshots through their slots
# (see driver.py), which a compiled class does not allow.
@mypyc_attr(native_class=False)
@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """The gateway state an arrival is judged on."""

    queued_by_class: tuple[int, int, int] = (0, 0, 0)
    """Requests in the admission queue per class (P0, P1, P2)."""
    free_slots: int = 0
    """Requests the ready replicas can take now (see `free_slots`)."""
    ready_replicas: int = 0
    dispatch_rate_per_s: float = 0.0
    """Recent dispatches per second (`RateMeter`); 0.0 when not measured yet."""
    degradation: DegradationLevel = DegradationLevel.NORMAL
    hard_limit_shed_share: float = 0.0
    """Share of P2 to shed for the hard limit: `HardLimit.current_shed_share()`, 0.0 when the
    limit is not crossed."""
    fair_ahead: int = -1
    """Queued requests that go before this one under tenant fair shares
    (`AdmissionQueue.ahead_of`); -1: all of its class and the more urgent ones."""
    fair_room: bool = False
    """When the queue is full: whether another tenant's request leaves to make room for
    this one, its tenant holding less than its share of the places
    (`AdmissionQueue.victim_for`)."""

    @classmethod
    def of(
        cls,
        ready: Iterable[ReplicaView],
        queued_by_class: tuple[int, int, int],
        *,
        kv_full_usage: float,
        dispatch_rate_per_s: float = 0.0,
        degradation: DegradationLevel = DegradationLevel.NORMAL,
        hard_limit_shed_share: float = 0.0,
    ) -> AdmissionSnapshot:
        """The snapshot over the replicas the gateway may route to now."""
        views = list(ready)
        return cls(
            queued_by_class=queued_by_class,
            free_slots=free_slots(views, kv_full_usage),
            ready_replicas=len(views),
            dispatch_rate_per_s=dispatch_rate_per_s,
            degradation=degradation,
            hard_limit_shed_share=hard_limit_shed_share,
        )

    @property
    def queued_total(self) -> int:
        return sum(self.queued_by_class)

    def queued_ahead(self, priority: int) -> int:
        """Queued requests that go before a new one of `priority`: its class and above."""
        return sum(self.queued_by_class[: priority + 1])


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision for one arriving request."""

    kind: AdmitKind
    reason: Reason
    retry_after_s: int = 0
    """Whole seconds for the Retry-After header of a 429/503 (>= 1 then); 0 otherwise."""
    max_tokens_cap: int | None = None
    """Upper bound on the request's max_tokens (degradation step CAP_TOKENS, class P1)."""


def free_slots(replicas: Iterable[ReplicaView], kv_full_usage: float) -> int:
    """Requests the replicas can take now: budget minus in flight, 0 for a full KV cache."""
    return sum(
        0 if view.kv_cache_usage >= kv_full_usage else max(0, view.capacity - view.in_flight)
        for view in replicas
    )


@mypyc_attr(allow_interpreted_subclasses=True)
class AdmissionController:
    """The arrival rules, in order (the first that applies decides):

    1. no ready replica: queue (cold-start buffering) if `cold_start_wait_s` > 0 and the queue
       has room, else 503 (429 "queue_full" when it is the room that is missing);
    2. P2 while degraded (SHED_BATCH or more): 429 "degraded";
    3. P2 while the hard limit is crossed: 429 "hard_limit" with probability shed share;
    4. more free slots than requests queued ahead of it (the more urgent classes, and of its
       own those its tenant's fair share lets go first, which would take the slots first):
       dispatch;
    5. queue full (`max_queued`), unless its tenant holds less than its fair share of the
       places (another tenant's request is then pushed out for it): 429 "queue_full";
    6. predicted wait (queued ahead, as in 4, / dispatch rate) over the class's budget: 429
       "queue_budget" (never while no rate is measured): under fair shares the tenant that
       floods the queue is the one that waits, and is shed;
    7. otherwise: queue.

    The queue-full rule comes after dispatch on purpose: a request that takes a free slot
    does not enter the queue, so `max_queued = 0` means "never queue", not "refuse all".
    """

    def __init__(
        self,
        admission: AdmissionConfig,
        protection: ProtectionConfig,
        *,
        default_retry_after_s: int = 2,
        max_retry_after_s: int = 60,
    ) -> None:
        if not 1 <= default_retry_after_s <= max_retry_after_s:
            raise ValueError("need 1 <= default_retry_after_s <= max_retry_after_s")
        self._admission = admission
        self._degraded_max_tokens = protection.degraded_max_tokens
        self._default_retry_after_s = default_retry_after_s
        self._max_retry_after_s = max_retry_after_s
        # The common decisions, built once: they are immutable, and a gateway (or a simulated
        # one) takes one per request.
        self._dispatch = Admission(AdmitKind.DISPATCH, Reason.FREE_SLOT)
        self._dispatch_capped = Admission(
            AdmitKind.DISPATCH, Reason.FREE_SLOT, max_tokens_cap=self._degraded_max_tokens
        )

    def admit(
        self, priority: int, snapshot: AdmissionSnapshot, now_s: float, rng: random.Random
    ) -> Admission:
        """Decide for a request of class `priority` arriving at `now_s`.

        `rng` is drawn from only for P2 requests while the hard limit is crossed. No rule
        depends on `now_s` today; it is part of the contract so that one may without
        changing the callers.
        """
        cls_ = check_priority(priority)
        level = snapshot.degradation
        # The P1 token cap (degradation step CAP_TOKENS) and AdmissionSnapshot.queued_ahead,
        # inlined: a gateway decides once per request.
        cap = self._degraded_max_tokens if cls_ == _P1 and level >= _CAP_TOKENS else None
        if snapshot.ready_replicas == 0:
            return self._cold_start(snapshot, cap)
        ahead = snapshot.fair_ahead
        if ahead < 0:
            p0, p1, p2 = snapshot.queued_by_class
            ahead = p0 if cls_ == 0 else p0 + p1 if cls_ == 1 else p0 + p1 + p2
        rate = snapshot.dispatch_rate_per_s
        if cls_ == LOWEST_CLASS:
            if level >= DegradationLevel.SHED_BATCH:
                return self._shed(Reason.DEGRADED, ahead, rate)
            share = snapshot.hard_limit_shed_share
            if share > 0.0 and rng.random() < share:
                return self._shed(Reason.HARD_LIMIT, ahead, rate)
        if snapshot.free_slots > ahead:
            return self._dispatch if cap is None else self._dispatch_capped
        if snapshot.queued_total >= self._admission.max_queued and not snapshot.fair_room:
            # Room appears as the whole queue moves, so the wait is that of the whole queue.
            return self._shed(Reason.QUEUE_FULL, snapshot.queued_total, rate)
        if rate > 0.0 and ahead / rate * 1000.0 > self._admission.queue_budget_ms[cls_]:
            return self._shed(Reason.QUEUE_BUDGET, ahead, rate)
        return Admission(AdmitKind.QUEUE, Reason.QUEUED, max_tokens_cap=cap)

    def retry_after_s(self, backlog: int, rate_per_s: float) -> int:
        """Seconds until `backlog` requests have been dispatched, whole, in [1, max]; the
        default when no rate is measured."""
        if rate_per_s <= 0.0:
            return self._default_retry_after_s
        # The epsilon keeps float noise (e.g. 3.0000000000000004) from adding a second.
        drain_s = math.ceil(backlog / rate_per_s - 1e-9)
        return min(self._max_retry_after_s, max(1, drain_s))

    def _cold_start(self, snapshot: AdmissionSnapshot, cap: int | None) -> Admission:
        if self._admission.cold_start_wait_s <= 0.0:
            return Admission(
                AdmitKind.UNAVAILABLE_503, Reason.NO_REPLICA, self._default_retry_after_s
            )
        if snapshot.queued_total >= self._admission.max_queued and not snapshot.fair_room:
            return self._shed(
                Reason.QUEUE_FULL, snapshot.queued_total, snapshot.dispatch_rate_per_s
            )
        return Admission(AdmitKind.QUEUE, Reason.COLD_START, max_tokens_cap=cap)

    def _shed(self, reason: Reason, backlog: int, rate_per_s: float) -> Admission:
        return Admission(AdmitKind.SHED_429, reason, self.retry_after_s(backlog, rate_per_s))


# Plain ints: comparing with an enum member looked up on its class costs more than the rule.
_P1 = int(Priority.P1)
_CAP_TOKENS = int(DegradationLevel.CAP_TOKENS)
