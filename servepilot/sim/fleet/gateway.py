"""The simulated gateway: the real routing policy and admission driver, fed simulated state.

The gateway (gateway/dispatch.py) and this module run the same `AdmissionDriver`
(routing/admission/driver.py): an arriving request is judged on the queue depth per class, the
free slots of the ready replicas, the dispatch rate, the degradation level and the hard
limit's shed share; it is dispatched to the replica the routing policy chooses among the
replicas with a free slot (in flight below the concurrency budget, scraped KV usage below
`kv_full_usage`), queued in the per-class queue, or refused (429/503). A finished request
frees its slot and pumps the queue; the driver's tick (every `BUSY_TICK_S` while requests
wait, `IDLE_TICK_S` otherwise) pumps, expires waits past their class's budget, and feeds the
soft limit. While no replica is ready but some are starting, requests wait up to
`cold_start_wait_s`. vLLM's gauges are refreshed every scrape interval; the gateway's own
in-flight counts are always current. This module is the driver's `Slots` and turns its
decisions into events (the `Outlet`).

Where the simulator differs, and why:
- Snapshots are kept up to date incrementally instead of being rebuilt per request: each
  replica has one `LiveView` (a `ReplicaView` the simulator updates in place when the
  replica's in-flight count or scraped gauges change), the free slots are a running sum and
  the candidate list is edited as replicas fill up and free up. The same values at O(1) per
  request. The candidate list's order is not registration order.
- The hard limit's shed share is read at most once per tick (the driver's
  `shed_share_per_tick`; it only matters for P2), not per request: between ticks it misses
  the last few milliseconds of samples.
- Not driven: circuit breakers and retries (simulated replicas do not fail), API keys and
  their rate limits, several models behind one gateway. Tenants come from the workload (a
  trace's `tenant` field) instead of API keys; their fair shares are the driver's.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Final, Protocol

from servepilot.core.config import GatewayConfig
from servepilot.routing.admission import AdmissionDriver, AdmitKind, FleetLoad, Reason
from servepilot.routing.base import ReplicaView, RoutingPolicy
from servepilot.sim.fleet.kvevents import KvEventFeed
from servepilot.sim.fleet.liveview import SET_IN_FLIGHT
from servepilot.sim.fleet.members import FleetReplica, FleetRequest, ReplicaState

_READY: Final = ReplicaState.READY
_STARTING: Final = ReplicaState.STARTING
_SET_IN_FLIGHT: Final = SET_IN_FLIGHT


class Outlet(Protocol):
    """What the gateway's decisions do to the rest of the fleet."""

    def send(self, request: FleetRequest, replica: FleetReplica, now_s: float) -> None: ...

    def refuse(self, request: FleetRequest, status: str, now_s: float) -> None: ...

    def queued(self, request: FleetRequest, now_s: float, cold_until_s: float | None) -> None:
        """It waits in the admission queue (during a cold start, until `cold_until_s`)."""
        ...


class SimGateway:
    def __init__(
        self,
        config: GatewayConfig,
        policy: RoutingPolicy,
        outlet: Outlet,
        rng: random.Random,
        kv_feed: KvEventFeed | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self._kv_feed = kv_feed
        """The replicas' KV events, subscribed to while a replica is in the gateway."""
        self._outlet = outlet
        driver: AdmissionDriver[FleetRequest] = AdmissionDriver(
            config, rng, shed_share_per_tick=True
        )
        self.driver = driver
        self.controller = driver.controller
        self.queue = driver.queue
        self.rate = driver.rate
        self._kv_full = config.admission.kv_full_usage
        self.replicas: dict[str, FleetReplica] = {}
        self._views: list[ReplicaView] = []
        """The replicas with a free slot: what the policy chooses among."""
        self._pos: dict[str, int] = {}
        self.free_slots = 0
        self.ready = 0
        self.starting = 0
        self.mean_kv_usage = 0.0
        self.vllm_waiting = 0
        self.shed: Counter[str] = Counter()
        """Refusals by reason (429 and 503)."""
        self.queued = 0
        """Requests that waited in the admission queue."""

    # ---- replicas ------------------------------------------------------------------------

    def add(self, replica: FleetReplica) -> None:
        self.replicas[replica.replica_id] = replica
        if self._kv_feed is not None:
            self._kv_feed.attach(replica)
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
        self.driver.forget(replica.replica_id)
        if self._kv_feed is not None:
            self._kv_feed.forget(replica)

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

    def set_budget(self, replica: FleetReplica, budget: int) -> None:
        """Its concurrency budget, as the gateway's `ReplicaPool.set_budget`: requests in
        flight above it finish; the queue gets new slots at the next tick."""
        replica.capacity = budget
        replica.view.set_capacity(budget)
        self.refresh(replica)

    def candidates(self) -> list[ReplicaView]:
        """The ready replicas with a free slot, as the policy sees them now."""
        return self._views

    # ---- the request path ----------------------------------------------------------------

    def arrive(self, request: FleetRequest, now_s: float) -> None:
        """Dispatch, queue or refuse a request that just reached the gateway."""
        priority = request.priority
        decision = self.driver.decide(
            priority, self.free_slots, self.ready, self.starting > 0, now_s, request.tenant
        )
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
        request.ticket = self.driver.enqueue(request, priority, now_s, request.tenant)
        if self.driver.pushed_out:
            pushed, self.driver.pushed_out = self.driver.pushed_out, []
            for victim in pushed:  # made room for a tenant under its share: 429
                victim.ticket = None
                self._refuse(victim, Reason.QUEUE_FULL, "http_429", now_s)
        self.queued += 1
        wait_s = self.driver.cold_wait_s(decision)
        self._outlet.queued(request, now_s, None if wait_s is None else now_s + wait_s)

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
        self.driver.dispatched(now_s)
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
        self.driver.release(replica.replica_id, ttfb_s, now_s, self)

    # ---- the driver's `Slots` ------------------------------------------------------------

    def place(self, request: FleetRequest, now_s: float) -> bool:
        """With one model behind the gateway, any candidate can take any waiting request."""
        if not self._views:
            return False
        request.ticket = None
        self._grant(request, now_s)
        return True

    def any_free(self) -> bool:
        return bool(self._views)

    def cold_timeout(self, request: FleetRequest, now_s: float) -> None:
        """A request queued during a cold start has waited `cold_start_wait_s`: 503."""
        ticket = request.ticket
        if ticket is not None and self.queue.remove(ticket):
            request.ticket = None
            self._refuse(request, Reason.NO_REPLICA, "http_503", now_s)

    # ---- the ticker and the scrape -------------------------------------------------------

    def tick(self, now_s: float) -> float:
        """The driver's tick (pump, expire, feed the soft limit); returns the delay to the
        next one."""
        load = FleetLoad(self.ready, self.starting > 0, self.mean_kv_usage, self.vllm_waiting)
        report = self.driver.tick(now_s, self, load)
        for request in report.expired:
            request.ticket = None
            self._refuse(request, Reason.QUEUE_BUDGET, "http_429", now_s)
        return report.next_tick_s

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
