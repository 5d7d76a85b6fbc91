"""The simulated gateway: the real routing and admission objects, driven as the gateway does.

`gateway/dispatch.py` is the model: an arriving request is judged by the `AdmissionController`
on an `AdmissionSnapshot` (queue depth per class, free slots of the ready replicas, dispatch
rate, degradation level, hard-limit shed share); it is dispatched to the replica the routing
policy chooses among the replicas with a free slot (in flight below the concurrency budget,
scraped KV usage below `kv_full_usage`), queued in the per-class `AdmissionQueue`, or refused
(429/503). A finished request frees its slot and pumps the queue; a ticker (every 20 ms while
requests wait, 500 ms otherwise) pumps, expires waits past their class's budget, and feeds the
soft limit. While no replica is ready but some are starting, requests wait up to
`cold_start_wait_s`. vLLM's gauges are refreshed every scrape interval; the gateway's own
in-flight counts are always current.

Where the simulator differs, and why:
- Snapshots are kept up to date incrementally instead of being rebuilt per request: each
  replica has one `LiveView` (a `ReplicaView` the simulator updates in place when the
  replica's in-flight count or scraped gauges change), the free slots are a running sum and
  the candidate list is edited as replicas fill up and free up. The same values at O(1) per
  request. The candidate list's order is not registration order.
- The hard limit's shed share is read at most once per tick (it only matters for P2), not
  per request: between ticks it misses the last few milliseconds of samples.
- Not driven: circuit breakers and retries (simulated replicas do not fail), API keys and
  their rate limits, several models behind one gateway.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Final, Protocol

from servepilot.core.gateway_config import GatewayConfig
from servepilot.routing.admission import (
    AdmissionController,
    AdmissionQueue,
    AdmissionSnapshot,
    AdmitKind,
    HardLimit,
    RateMeter,
    Reason,
    SoftLimit,
)
from servepilot.routing.admission.decision import LOWEST_CLASS
from servepilot.routing.base import ReplicaView, RoutingPolicy
from servepilot.sim.fleet.liveview import SET_IN_FLIGHT, SNAPSHOT_SETTERS
from servepilot.sim.fleet.members import FleetReplica, FleetRequest, ReplicaState

BUSY_TICK_S: Final = 0.02
IDLE_TICK_S: Final = 0.5
_READY: Final = ReplicaState.READY
_STARTING: Final = ReplicaState.STARTING
_SET: Final = SNAPSHOT_SETTERS
_SET_IN_FLIGHT: Final = SET_IN_FLIGHT
_new: Final = object.__new__


class Outlet(Protocol):
    """What the gateway's decisions do to the rest of the fleet."""

    def send(self, request: FleetRequest, replica: FleetReplica, now_s: float) -> None: ...

    def refuse(self, request: FleetRequest, status: str, now_s: float) -> None: ...

    def queued(self, request: FleetRequest, now_s: float, cold_until_s: float | None) -> None:
        """It waits in the admission queue (during a cold start, until `cold_until_s`)."""
        ...


class SimGateway:
    def __init__(
        self, config: GatewayConfig, policy: RoutingPolicy, outlet: Outlet, rng: random.Random
    ) -> None:
        self.config = config
        self.policy = policy
        self._outlet = outlet
        self._rng = rng
        self.controller = AdmissionController(
            config.admission, config.protection, default_retry_after_s=config.retry_after_s
        )
        self.queue: AdmissionQueue[FleetRequest] = AdmissionQueue.from_config(config.admission)
        self.hard_limit = HardLimit.from_config(config.protection)
        self.soft_limit = SoftLimit.from_config(config.protection)
        self.rate = RateMeter()
        self._kv_full = config.admission.kv_full_usage
        self._cold_wait_s = config.admission.cold_start_wait_s
        self.replicas: dict[str, FleetReplica] = {}
        self._views: list[ReplicaView] = []
        """The replicas with a free slot: what the policy chooses among."""
        self._pos: dict[str, int] = {}
        self.free_slots = 0
        self.ready = 0
        self.starting = 0
        self.mean_kv_usage = 0.0
        self.vllm_waiting = 0
        self._shed_share = 0.0
        self._shed_stale = True
        self.shed: Counter[str] = Counter()
        """Refusals by reason (429 and 503)."""
        self.queued = 0
        """Requests that waited in the admission queue."""

    # ---- replicas ------------------------------------------------------------------------

    def add(self, replica: FleetReplica) -> None:
        self.replicas[replica.replica_id] = replica
        if replica.state is _READY:
            self.ready += 1
        else:
            self.starting += 1
        self.refresh(replica)

    def drain(self, replica: FleetReplica) -> None:
        """Stop routing to it; the caller retires it once its requests are done."""
        if replica.state is _READY:
            self.ready -= 1
        elif replica.state is _STARTING:
            self.starting -= 1
        replica.state = ReplicaState.DRAINING
        self.refresh(replica)

    def remove(self, replica: FleetReplica) -> None:
        if replica.state is not ReplicaState.DRAINING:
            self.drain(replica)
        replica.state = ReplicaState.STOPPED
        del self.replicas[replica.replica_id]
        self.policy.forget(replica.replica_id)
        self.hard_limit.forget(replica.replica_id)

    def refresh(self, replica: FleetReplica) -> None:
        """Its state changed: recount its free slots, update its view, and keep the list of
        candidates (ready, with a free slot) current."""
        slots = 0
        if replica.state is _READY and replica.kv_usage < self._kv_full:
            slots = max(0, replica.capacity - replica.in_flight)
        self.free_slots += slots - replica.slots
        replica.slots = slots
        view = replica.view
        _SET_IN_FLIGHT(view, replica.in_flight)
        pos = self._pos
        rid = replica.replica_id
        index = pos.get(rid)
        if slots:
            if index is None:
                pos[rid] = len(self._views)
                self._views.append(view)
        elif index is not None:
            views = self._views
            last = views.pop()
            if last is not view:
                views[index] = last
                pos[last.replica_id] = index
            del pos[rid]

    def candidates(self) -> list[ReplicaView]:
        """The ready replicas with a free slot, as the policy sees them now."""
        return self._views

    # ---- the request path ----------------------------------------------------------------

    def arrive(self, request: FleetRequest, now_s: float) -> None:
        """Dispatch, queue or refuse a request that just reached the gateway."""
        if not self.ready and not self.starting:
            self._refuse(request, Reason.NO_REPLICA, "http_503", now_s)
            return
        priority = request.priority
        if priority == LOWEST_CLASS and self._shed_stale:
            self._shed_share = self.hard_limit.current_shed_share()
            self._shed_stale = False
        # AdmissionSnapshot(...), for a third of the cost (liveview.py).
        snapshot: AdmissionSnapshot = _new(AdmissionSnapshot)
        _SET[0](snapshot, self.queue.depth_by_class())
        _SET[1](snapshot, self.free_slots)
        _SET[2](snapshot, self.ready)
        _SET[3](snapshot, self.rate.rate_per_s(now_s))
        _SET[4](snapshot, self.soft_limit.level)
        _SET[5](snapshot, self._shed_share)
        decision = self.controller.admit(priority, snapshot, now_s, self._rng)
        kind = decision.kind
        cap = decision.max_tokens_cap
        if cap is not None and request.output_tokens > cap:
            request.output_tokens = cap
        if kind is AdmitKind.DISPATCH:
            if self._views:
                self._grant(request, now_s)
                return
        elif kind is AdmitKind.SHED_429:
            self._refuse(request, decision.reason, "http_429", now_s)
            return
        elif kind is AdmitKind.UNAVAILABLE_503:
            self._refuse(request, decision.reason, "http_503", now_s)
            return
        request.ticket = self.queue.push(request, priority, now_s)
        self.queued += 1
        cold = decision.reason is Reason.COLD_START
        self._outlet.queued(request, now_s, now_s + self._cold_wait_s if cold else None)

    def _grant(self, request: FleetRequest, now_s: float) -> None:
        view = request.view
        assert view is not None
        chosen = self.policy.choose(view, self._views)
        replica = self.replicas[chosen]
        replica.dispatched += 1
        replica.in_flight += 1
        if replica.slots > 1:
            # Still a candidate with one slot fewer: what `refresh` would find, sooner.
            replica.slots -= 1
            self.free_slots -= 1
            _SET_IN_FLIGHT(replica.view, replica.in_flight)
        else:
            self.refresh(replica)
        self.rate.record(now_s)
        self._outlet.send(request, replica, now_s)

    def _refuse(self, request: FleetRequest, reason: Reason, status: str, now_s: float) -> None:
        self.shed[reason.value] += 1
        self._outlet.refuse(request, status, now_s)

    def release(self, request: FleetRequest, now_s: float, ttfb_s: float | None) -> None:
        """The answer has passed the gateway: free the slot, judge the first byte's delay,
        hand freed slots to waiting requests."""
        replica = request.replica
        assert replica is not None
        replica.in_flight -= 1
        if replica.slots:
            replica.slots += 1  # a candidate already: one slot more (see `refresh`)
            self.free_slots += 1
            _SET_IN_FLIGHT(replica.view, replica.in_flight)
        else:
            self.refresh(replica)
        if ttfb_s is not None:
            self.hard_limit.observe(replica.replica_id, ttfb_s * 1000.0)
        if len(self.queue):
            self.pump(now_s)

    def pump(self, now_s: float) -> None:
        """Give free slots to the most urgent waiters, while there are both."""
        queue = self.queue
        # The gateway peeks, then pops what it can place; with one model behind it, any
        # candidate can take the head, so the simulator pops straight away (the same request:
        # peek is pop without the taking), one scan of the queue's heads instead of three.
        while len(queue) and self._views:
            request = queue.pop(now_s)
            if request is None:
                return
            request.ticket = None
            self._grant(request, now_s)

    def cold_timeout(self, request: FleetRequest, now_s: float) -> None:
        """A request queued during a cold start has waited `cold_start_wait_s`: 503."""
        ticket = request.ticket
        if ticket is not None and self.queue.remove(ticket):
            request.ticket = None
            self._refuse(request, Reason.NO_REPLICA, "http_503", now_s)

    # ---- the ticker and the scrape -------------------------------------------------------

    def tick(self, now_s: float) -> float:
        """Pump, expire, feed the soft limit; returns the delay to the next tick."""
        self.pump(now_s)
        if self.ready or not self.starting:  # cold start: waits are bounded separately
            for request in self.queue.expired(now_s):
                request.ticket = None
                self._refuse(request, Reason.QUEUE_BUDGET, "http_429", now_s)
        queued = len(self.queue) + self.vllm_waiting
        self.soft_limit.update(now_s, self.mean_kv_usage, queued, self.ready)
        self._shed_stale = True
        return BUSY_TICK_S if len(self.queue) else IDLE_TICK_S

    def scrape(self, now_s: float) -> None:
        """Health checks and /metrics of every replica: starting replicas whose engine is
        up become ready; vLLM's gauges are refreshed."""
        kv_total = 0.0
        waiting = 0
        for replica in self.replicas.values():
            if replica.state is _STARTING and replica.engine_ready:
                replica.state = _READY
                replica.ready_s = now_s
                self.starting -= 1
                self.ready += 1
            if replica.state is not _READY:
                continue
            model = replica.model
            replica.running = model.num_running
            replica.waiting = model.num_waiting
            replica.kv_usage = model.kv_usage
            replica.view.set_gauges(replica.running, replica.waiting, replica.kv_usage)
            kv_total += replica.kv_usage
            waiting += replica.waiting
            self.refresh(replica)
        self.mean_kv_usage = kv_total / self.ready if self.ready else 0.0
        self.vllm_waiting = waiting
