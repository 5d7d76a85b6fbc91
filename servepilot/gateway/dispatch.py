"""Admission at the gateway: who gets a replica slot now, who waits, who is refused.

Every decision is made by the pure objects of `routing.admission` (the simulator runs the
same ones); this module is their I/O edge: it builds the snapshots, parks waiting requests on
futures in the per-class queue, hands out slots as requests finish, and owns the ticker that
expires waits, feeds the soft limit and reports each degradation step.

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

from servepilot.core.gateway_config import GatewayConfig
from servepilot.gateway.errors import UPSTREAM, GatewayError, no_ready_replica, shed
from servepilot.gateway.metrics import GatewayMetrics
from servepilot.gateway.pool import ReplicaPool, wait_until
from servepilot.gateway.relay import Outcome
from servepilot.gateway.replica import Replica
from servepilot.routing.admission import (
    AdmissionController,
    AdmissionQueue,
    AdmissionSnapshot,
    AdmitKind,
    BreakerBoard,
    HardLimit,
    RateMeter,
    Reason,
    SoftLimit,
    Ticket,
)
from servepilot.routing.base import ReplicaView, RequestView, RoutingPolicy

log = logging.getLogger(__name__)

# While requests wait, how often budgets are checked; otherwise how often the soft limit is.
_BUSY_TICK_S = 0.02
_IDLE_TICK_S = 0.5


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
        self._rng = random.Random(seed)
        self._controller = AdmissionController(
            config.admission, config.protection, default_retry_after_s=config.retry_after_s
        )
        self.queue: AdmissionQueue[_Waiter] = AdmissionQueue.from_config(config.admission)
        self.breakers = BreakerBoard.from_config(config.protection)
        self.hard_limit = HardLimit.from_config(config.protection)
        self.soft_limit = SoftLimit.from_config(config.protection)
        self._rate = RateMeter()
        self._kv_full = config.admission.kv_full_usage
        self._ticker: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        pool.on_remove(self._forget)

    def now_s(self) -> float:
        return self._clock()

    # --- the request path -----------------------------------------------------------------

    async def acquire(self, view: RequestView, exclude: set[str] | frozenset[str]) -> Grant:
        """A slot for the request now, or after waiting in its class's queue; raises the
        429/503 `GatewayError` when it is refused."""
        now = self._clock()
        ready = self._candidates(view.model, frozenset(), now)
        if exclude and not any(c.replica_id not in exclude for c in ready):
            raise _unreachable(exclude)
        if not ready and not self._pool.starting():
            # Cold-start buffering is for replicas on their way up; when every replica
            # is down (or none is registered), waiting would only hide the outage.
            self._metrics.count_shed(Reason.NO_REPLICA, view.priority)
            raise no_ready_replica(self._config.retry_after_s)
        snapshot = AdmissionSnapshot.of(
            ready,
            self.queue.depth_by_class(),
            kv_full_usage=self._kv_full,
            dispatch_rate_per_s=self._rate.rate_per_s(now),
            degradation=self.soft_limit.level,
            hard_limit_shed_share=self.hard_limit.current_shed_share(),
        )
        decision = self._controller.admit(view.priority, snapshot, now, self._rng)
        if decision.kind is AdmitKind.DISPATCH:
            candidates = [c for c in ready if c.replica_id not in exclude and self._free(c)]
            if candidates:
                return self._grant(view, candidates, decision.max_tokens_cap, now)
        elif decision.kind is AdmitKind.SHED_429:
            self._metrics.count_shed(decision.reason, view.priority)
            raise shed(_SHED_MESSAGES[decision.reason], decision.reason, decision.retry_after_s)
        elif decision.kind is AdmitKind.UNAVAILABLE_503:
            self._metrics.count_shed(decision.reason, view.priority)
            raise no_ready_replica(decision.retry_after_s)
        return await self._wait(view, frozenset(exclude), decision.max_tokens_cap, decision.reason)

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
        if outcome is None:
            self.breakers.record_abandoned(rid, now)
        elif outcome.failure is not None or outcome.status >= 500:
            self.breakers.record_failure(rid, now)
            if outcome.retryable:
                self._pool.record_failure(replica)
        else:
            self.breakers.record_success(rid, now)
            if replica.consecutive_failures:
                self._pool.record_success(replica)
            if outcome.streamed:
                self.hard_limit.observe(rid, outcome.ttfb_s * 1000.0)
        self._metrics.observe_outcome(rid, grant.priority, outcome)
        if len(self.queue):
            self._pump(now)

    # --- slots ----------------------------------------------------------------------------

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
        self, view: RequestView, candidates: list[ReplicaView], cap: int | None, now: float
    ) -> Grant:
        chosen = self._policy.choose(view, candidates)
        # In half-open this claims the breaker's single probe; the policy only picked among
        # replicas that would allow, so a refusal here is a probe taken a moment ago.
        self.breakers.allow(chosen, now)
        replica = self._pool.acquire(chosen)
        self._rate.record(now)
        return Grant(replica, view.priority, cap)

    async def _wait(
        self, view: RequestView, exclude: frozenset[str], cap: int | None, reason: Reason
    ) -> Grant:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(view, exclude, cap, loop.create_future())
        ticket = self.queue.push(waiter, view.priority, self._clock())
        self._metrics.count_queued(view.priority)
        self._wake.set()
        try:
            if reason is not Reason.COLD_START:
                return await waiter.future
            async with asyncio.timeout(self._config.admission.cold_start_wait_s):
                return await waiter.future
        except TimeoutError:
            self._abandon(ticket, waiter)
            self._metrics.count_shed(Reason.NO_REPLICA, view.priority)
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

    def _pump(self, now: float) -> None:
        """Give free slots to the most urgent waiters, while there are both."""
        queue = self.queue
        while len(queue):
            waiter = queue.peek(now)
            if waiter is None:
                return
            if waiter.future.done():  # its client left; the ticket goes with the pop
                queue.pop(now)
                continue
            ready = self._candidates(waiter.view.model, waiter.exclude, now)
            candidates = [c for c in ready if self._free(c)]
            if not candidates:
                # It keeps its place until a slot it can use frees up; the ones behind it
                # (another model, other excluded replicas) may use the free slots meanwhile.
                self._pump_behind(now)
                return
            queue.pop(now)
            self._hand_over(waiter, candidates, now)

    def _pump_behind(self, now: float) -> None:
        if not any(self._free(view) for view in self._pool.snapshot()):
            return
        for ticket in self.queue.in_order(now):
            waiter = ticket.item
            if waiter.future.done():
                self.queue.remove(ticket)
                continue
            ready = self._candidates(waiter.view.model, waiter.exclude, now)
            candidates = [c for c in ready if self._free(c)]
            if candidates:
                self.queue.remove(ticket)
                self._hand_over(waiter, candidates, now)

    def _hand_over(self, waiter: _Waiter, candidates: list[ReplicaView], now: float) -> None:
        grant = self._grant(waiter.view, candidates, waiter.cap, now)
        self._metrics.observe_queue_wait(waiter.view.priority, now - waiter.view.arrival_s)
        waiter.future.set_result(grant)

    def _expire(self, now: float) -> None:
        if not self._pool.ready() and self._pool.starting():
            return  # cold start: waits are bounded by cold_start_wait_s instead
        rate = self._rate.rate_per_s(now)
        for waiter in self.queue.expired(now):
            if waiter.future.done():
                continue
            retry = self._controller.retry_after_s(len(self.queue), rate)
            self._metrics.count_shed(Reason.QUEUE_BUDGET, waiter.view.priority)
            waiter.future.set_exception(
                shed(_SHED_MESSAGES[Reason.QUEUE_BUDGET], Reason.QUEUE_BUDGET, retry)
            )

    # --- the ticker -----------------------------------------------------------------------

    def start(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="dispatch")

    async def stop(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        for waiter in self.queue.expired(float("inf")):
            if not waiter.future.done():
                waiter.future.set_exception(no_ready_replica(self._config.retry_after_s))

    async def drain(self, timeout_s: float) -> None:
        """Shutdown: let queued requests get their slot (or their 429) before the end."""
        await wait_until(lambda: not len(self.queue), timeout_s)

    async def _tick(self) -> None:
        while True:
            busy = len(self.queue) > 0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_BUSY_TICK_S if busy else _IDLE_TICK_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                now = self._clock()
                self._pump(now)
                self._expire(now)
                self._update_limits(now)
            except Exception:  # a bug here must not silently end admission
                log.exception("dispatcher tick failed")

    def _update_limits(self, now: float) -> None:
        views = self._pool.snapshot()
        routable = {view.replica_id for view in views}
        for replica_id in self.hard_limit.tracked() - routable:
            self.hard_limit.forget(replica_id)  # out of rotation: it gets no traffic to slow
        mean_kv = sum(v.kv_cache_usage for v in views) / len(views) if views else 0.0
        queued = len(self.queue) + sum(v.num_requests_waiting for v in views)
        for event in self.soft_limit.update(now, mean_kv, queued, len(views)):
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

    def _forget(self, replica_id: str) -> None:
        self.breakers.forget(replica_id)
        self.hard_limit.forget(replica_id)


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
