"""Admission at the gateway: who gets a replica slot now, who waits, who is refused.

Every decision is made by `routing.admission`'s `AdmissionDriver` (the simulator runs the
same one, sim/fleet/gateway.py); this module is its I/O edge: the replicas' slots (pool,
breakers, models, excluded replicas), waiting requests parked on futures, and the asyncio
ticker that runs the driver's tick and reports each degradation step and breaker transition.

A replica gets at most its concurrency budget (`capacity`) of requests in flight, and none
while its scraped KV cache usage is at the full line: the queueing happens here, where
priority can act, instead of inside vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from servepilot.core.config import GatewayConfig
from servepilot.core.loop import cancel_and_wait
from servepilot.gateway.errors import UPSTREAM, GatewayError, no_ready_replica, shed
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.gateway.pool import ReplicaPool, wait_until
from servepilot.gateway.relay import Outcome
from servepilot.gateway.replica import Replica
from servepilot.routing.admission import (
    AdmissionDriver,
    AdmitKind,
    BreakerBoard,
    FleetLoad,
    Reason,
    Ticket,
    free_slots,
)
from servepilot.routing.base import ReplicaView, RequestView, RoutingPolicy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Grant:
    """A slot on one replica, held from `acquire` to `release`."""

    replica: Replica
    priority: int
    max_tokens_cap: int | None


@dataclass(slots=True)
class _Waiter:
    view: RequestView
    exclude: frozenset[str]
    cap: int | None
    future: asyncio.Future[Grant]
    tenant: str


class Dispatcher:
    """Admission, per-class queueing, replica budgets, breakers, hard and soft limits."""

    def __init__(
        self,
        config: GatewayConfig,
        pool: ReplicaPool,
        policy: RoutingPolicy,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        seed: int | None = None,
    ) -> None:
        self._config = config
        self._pool = pool
        self._policy = policy
        self._metrics = metrics
        self._clock = clock
        self.driver: AdmissionDriver[_Waiter] = AdmissionDriver(config, random.Random(seed))
        self.queue = self.driver.queue
        self.hard_limit = self.driver.hard_limit
        self.soft_limit = self.driver.soft_limit
        self.breakers = BreakerBoard.from_config(config.protection)
        self._kv_full = config.admission.kv_full_usage
        self._ticker: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        pool.on_remove(self._forget)

    def now_s(self) -> float:
        return self._clock()

    # --- the request path -----------------------------------------------------------------

    async def acquire(
        self, view: RequestView, exclude: set[str] | frozenset[str], tenant: str
    ) -> Grant:
        """A slot for `tenant`'s request now, or after waiting in its class's queue (in its
        tenant's fair share); raises the 429/503 `GatewayError` when it is refused."""
        now = self._clock()
        ready = self._candidates(view.model, frozenset(), now)
        if exclude and not any(c.replica_id not in exclude for c in ready):
            raise _unreachable(exclude)
        starting = not ready and self._pool.starting()
        free = free_slots(ready, self._kv_full)
        decision = self.driver.decide(view.priority, free, len(ready), starting, now, tenant)
        if decision.kind is AdmitKind.DISPATCH:
            candidates = [c for c in ready if c.replica_id not in exclude and self._free(c)]
            if candidates:
                return self._grant(view, candidates, decision.max_tokens_cap, now, tenant)
        elif decision.kind is AdmitKind.SHED_429:
            self._refused(decision.reason, view.priority, tenant)
            raise shed(_SHED_MESSAGES[decision.reason], decision.reason, decision.retry_after_s)
        elif decision.kind is AdmitKind.UNAVAILABLE_503:
            self._refused(decision.reason, view.priority, tenant)
            raise no_ready_replica(decision.retry_after_s)
        waiter = _Waiter(view, frozenset(exclude), decision.max_tokens_cap,
                         asyncio.get_running_loop().create_future(), tenant)  # fmt: skip
        return await self._wait(waiter, self.driver.cold_wait_s(decision))

    def acquire_tokenizer(self, view: RequestView, exclude: set[str] | frozenset[str]) -> Grant:
        """A replica for a /tokenize or /detokenize call, outside admission: these calls
        take milliseconds and leave nothing on the replica, and a load tester builds its
        prompts with them while the fleet is full, so queueing or shedding them would only
        stall it. They still count in flight (a draining replica waits for them) and are
        judged by the breakers on release like any other call."""
        now = self._clock()
        ready = self._candidates(view.model, frozenset(exclude), now)
        if not ready:
            if exclude:
                raise _unreachable(exclude)
            self._metrics.count_shed(Reason.NO_REPLICA, view.priority)
            raise no_ready_replica(self._config.retry_after_s)
        chosen = min(ready, key=lambda c: c.in_flight).replica_id
        self.breakers.allow(chosen, now)
        return Grant(self._pool.acquire(chosen), view.priority, None)

    def release(self, grant: Grant, outcome: Outcome | None) -> None:
        """The request is done with its slot; judge the replica by the outcome, then give
        freed slots to waiting requests."""
        replica = grant.replica
        replica.in_flight -= 1
        now = self._clock()
        rid = replica.replica_id
        ttfb_s = None
        if outcome is None:
            self.breakers.record_abandoned(rid, now)
        elif outcome.failure is not None or outcome.status >= 500:
            self.breakers.record_failure(rid, now)
            if outcome.retryable:
                self._pool.record_failure(replica, f"a request failed: {outcome.failure}")
        else:
            self.breakers.record_success(rid, now)
            if replica.consecutive_failures:
                self._pool.record_success(replica)
            if outcome.streamed:
                ttfb_s = outcome.ttfb_s
        self._metrics.observe_outcome(rid, grant.priority, outcome)
        self.driver.release(rid, ttfb_s, now, self)

    # --- slots (the driver's `Slots`) -------------------------------------------------------

    def place(self, waiter: _Waiter, now_s: float) -> bool:
        if waiter.future.done():  # its client left; the ticket goes
            return True
        ready = self._candidates(waiter.view.model, waiter.exclude, now_s)
        candidates = [c for c in ready if self._free(c)]
        if not candidates:
            return False
        grant = self._grant(waiter.view, candidates, waiter.cap, now_s, waiter.tenant)
        wait_s = now_s - waiter.view.arrival_s
        self._metrics.observe_queue_wait(waiter.view.priority, waiter.tenant, wait_s)
        waiter.future.set_result(grant)
        return True

    def any_free(self) -> bool:
        return any(self._free(view) for view in self._pool.snapshot())

    def _free(self, view: ReplicaView) -> bool:
        return view.in_flight < view.capacity and view.kv_cache_usage < self._kv_full

    def _candidates(self, model: str, exclude: frozenset[str], now: float) -> list[ReplicaView]:
        """Routable replicas whose breaker lets requests through (full ones included)."""
        breakers = self.breakers
        return [
            view
            for view in self._pool.snapshot(model)
            if view.replica_id not in exclude and breakers.would_allow(view.replica_id, now)
        ]

    def _grant(
        self,
        view: RequestView,
        candidates: list[ReplicaView],
        cap: int | None,
        now: float,
        tenant: str,
    ) -> Grant:
        chosen = self._policy.choose(view, candidates)
        # In half-open this claims the breaker's single probe; the policy only picked among
        # replicas that would allow, so a refusal here is a probe taken a moment ago.
        self.breakers.allow(chosen, now)
        replica = self._pool.acquire(chosen)
        self.driver.dispatched(now)
        self._metrics.tenants.count_admitted(tenant)
        return Grant(replica, view.priority, cap)

    def _refused(self, reason: Reason, priority: int, tenant: str) -> None:
        self._metrics.count_shed(reason, priority)
        self._metrics.tenants.count_rejected(tenant)

    async def _wait(self, waiter: _Waiter, wait_s: float | None) -> Grant:
        view = waiter.view
        now = self._clock()
        ticket = self.driver.enqueue(waiter, view.priority, now, waiter.tenant)
        if self.driver.pushed_out:
            pushed, self.driver.pushed_out = self.driver.pushed_out, []
            self._refuse_queued(pushed, Reason.QUEUE_FULL, now)
        self._metrics.count_queued(view.priority)
        self._metrics.tenants.count_queued(waiter.tenant)
        self._wake.set()
        try:
            if wait_s is None:
                return await waiter.future
            async with asyncio.timeout(wait_s):
                return await waiter.future
        except TimeoutError:
            self._abandon(ticket, waiter)
            self._refused(Reason.NO_REPLICA, view.priority, waiter.tenant)
            raise no_ready_replica(self._config.retry_after_s) from None
        except BaseException:
            self._abandon(ticket, waiter)
            raise

    def _abandon(self, ticket: Ticket[_Waiter], waiter: _Waiter) -> None:
        """The wait ended without the request taking its slot (client gone, timeout)."""
        self.queue.remove(ticket)
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self.release(future.result(), None)  # granted just as the wait was abandoned

    # --- the ticker -----------------------------------------------------------------------

    def start(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="dispatch")

    async def stop(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            await cancel_and_wait(ticker)
        for waiter in self.queue.expired(float("inf")):
            if not waiter.future.done():
                waiter.future.set_exception(no_ready_replica(self._config.retry_after_s))

    async def drain(self, timeout_s: float) -> None:
        """Shutdown: let queued requests get their slot (or their 429) before the end."""
        await wait_until(lambda: not len(self.queue), timeout_s)

    async def _tick(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.driver.next_tick_s()):
                    await self._wake.wait()
            self._wake.clear()
            try:
                self._step(self._clock())
            except Exception:  # a bug here must not silently end admission
                log.exception("dispatcher tick failed")

    def _step(self, now: float) -> None:
        views = self._pool.snapshot()
        mean_kv = sum(v.kv_cache_usage for v in views) / len(views) if views else 0.0
        waiting = sum(v.num_requests_waiting for v in views)
        starting = not views and self._pool.starting()
        report = self.driver.tick(now, self, FleetLoad(len(views), starting, mean_kv, waiting))
        self._refuse_queued(report.expired, Reason.QUEUE_BUDGET, now)
        if not views and not starting:
            self._refuse_all(now)  # nothing to wait for any more: the cold start failed
        routable = {view.replica_id for view in views}
        for replica_id in self.hard_limit.tracked() - routable:
            self.driver.forget(replica_id)  # out of rotation: it gets no traffic to slow
        for event in report.degradations:
            log.warning(
                "degradation %s -> %s (%s)",
                event.from_level.name,
                event.to_level.name,
                event.reason,
            )
            self._metrics.count_degradation(event.to_level)
        for transition in self.breakers.drain_events():
            log.warning(
                "breaker of %s: %s -> %s",
                transition.name,
                transition.from_state,
                transition.to_state,
            )
            self._metrics.count_breaker(transition.name, transition.to_state)

    def _refuse_queued(self, waiters: list[_Waiter], reason: Reason, now: float) -> None:
        """429 for waits taken out of the queue: past their class's budget (`queue_budget`),
        or pushed out of a full queue for a tenant under its share (`queue_full`)."""
        for waiter in waiters:
            if waiter.future.done():
                continue
            retry = self.driver.queue_retry_after_s(now)
            self._refused(reason, waiter.view.priority, waiter.tenant)
            waiter.future.set_exception(shed(_SHED_MESSAGES[reason], reason, retry))

    def _refuse_all(self, now: float) -> None:
        """503 for every waiting request: no replica is ready and none is starting."""
        for waiter in self.queue.expired(float("inf")):
            if not waiter.future.done():
                self._refused(Reason.NO_REPLICA, waiter.view.priority, waiter.tenant)
                waiter.future.set_exception(no_ready_replica(self._config.retry_after_s))

    def _forget(self, replica_id: str) -> None:
        self.breakers.forget(replica_id)
        self.driver.forget(replica_id)


def _unreachable(tried: set[str] | frozenset[str]) -> GatewayError:
    return GatewayError(
        502,
        f"could not connect to any replica (tried {', '.join(sorted(tried))})",
        error_type=UPSTREAM,
        code="upstream_unreachable",
    )


_SHED_MESSAGES = {
    Reason.DEGRADED: "the service is degraded under sustained load; batch requests are "
    "refused for now, retry later",
    Reason.HARD_LIMIT: "replicas answer slowly; some batch requests are shed, retry later",
    Reason.QUEUE_FULL: "the gateway's queue is full; retry later",
    Reason.QUEUE_BUDGET: "the wait for a replica would exceed this priority class's queue "
    "budget; retry later",
    Reason.NO_REPLICA: "no replica is ready to serve this request; retry later",
}
