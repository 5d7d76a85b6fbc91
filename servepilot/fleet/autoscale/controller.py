"""The controller: every `interval_s` it asks a scaling policy how many replicas the fleet
should have and makes it so through the fleet's `ReplicaBackend` (`fleet.backend`).

More replicas: the backend launches them; each joins the gateway once ready (until then it
counts as starting, so the policy sees the capacity on its way). Fewer: replicas still
starting go first, newest first, then the ready ones the backend wants back first (on Ray,
one sharing a node), then the newest ready ones, each drained at the gateway
(no new requests; those in flight finish, up to `drain_timeout_s`) before the backend stops
it. While a removal drains, the controller keeps deciding (the policies' windows need every
tick) but changes nothing. A backend that fails is logged and counted; the next tick decides
afresh and tries again. A replica that fails to start is replaced once; if that fails too,
cold starts are held and reported (`starts.StartTracker`).

With a warm pool (`pool_target` replicas asleep or parked: fleet.yaml's replicas.asleep), the
policy's count becomes actions through `scaling.warm_pool.plan_pool`: up wakes pool replicas
before it starts any cold (a waking one counts as capacity on its way), down puts replicas to
sleep into the pool (drained first) while it is short, and stops the rest; a pool short of its
target is refilled by cold starts that are put to sleep once they serve (left out of the
policy's snapshot until then).

With an adaptive budget (autoscale.adaptive_budget), each tick first sets every replica's
concurrency budget at the gateway to the one `scaling.adaptive_budget` picks for the arrival
rate.

Its one task is owned: `start` makes it, `stop` ends it, then the removals under way, then the
backend's waits for starting replicas, in that order, without waiting on any drain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from servepilot.core.loop import cancel_all_and_wait, cancel_and_wait
from servepilot.fleet.autoscale.decision import Decision, pool_text
from servepilot.fleet.autoscale.starts import StartTracker
from servepilot.fleet.autoscale.view import PoolView
from servepilot.fleet.backend import ReplicaBackend, ReplicaState, remove_first_ids
from servepilot.scaling.adaptive_budget import AdaptiveBudget, BudgetDecision
from servepilot.scaling.snapshot import (
    AutoscalePolicy,
    FleetSnapshot,
    ReplicaSample,
    ScaleDecision,
)
from servepilot.scaling.warm_pool import PoolCounts, PoolPlan, plan_pool

log = logging.getLogger(__name__)

_ARRIVALS_EVERY_S = 1.0
"""The arrival history's resolution: a forecast reads arrivals per second."""


class FleetView(Protocol):
    """What the controller reads from, and asks of, the gateway (`view.GatewayView`)."""

    def count_arrivals(self, now_s: float) -> None: ...

    def snapshot(
        self, now_s: float, starting: Collection[str], leave_out: Collection[str] = ()
    ) -> FleetSnapshot: ...

    def pool(self) -> PoolView: ...

    async def drain(self, replica_id: str, timeout_s: float) -> bool: ...

    async def sleep(self, replica_id: str, drain_timeout_s: float) -> None: ...

    async def wake(self, replica_id: str) -> float: ...

    def apply_budget(self, decision: BudgetDecision) -> int: ...


class AutoscaleController:
    def __init__(
        self,
        policy: AutoscalePolicy,
        backend: ReplicaBackend,
        fleet: FleetView,
        *,
        interval_s: float,
        drain_timeout_s: float,
        startup_timeout_s: float,
        pool_target: int = 0,
        budget: AdaptiveBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        """`clock`: the policy's time (the gateway's: time.monotonic); `on_decision` hears
        every decision after it is logged and counted (`up` reports changes);
        `startup_timeout_s`: how long a replica may stay starting before it is given up;
        `pool_target`: replicas kept asleep or parked (0: no warm pool; replicas put to
        sleep by hand are then left alone, and woken first when the fleet grows);
        `budget`: the adaptive admission budget applied to every replica each tick."""
        self.policy = policy
        self._backend = backend
        self._fleet = fleet
        self.interval_s = interval_s
        self._drain_timeout_s = drain_timeout_s
        self._startup_timeout_s = startup_timeout_s
        self.pool_target = pool_target
        self.budget = budget
        self._clock = clock
        self._on_decision = on_decision
        self.last: Decision | None = None
        self.last_pool = PoolCounts(0, 0)
        """The fleet at the last decision: serving or on their way, held, refilling."""
        self.decisions: dict[tuple[str, str], int] = {}
        """Decisions taken, by (direction, reason)."""
        self.errors = 0
        """Changes the backend (or a drain, sleep or wake) failed to make."""
        self.gave_up = 0
        """Replicas removed because they were still starting past startup_timeout_s."""
        self.wakes = 0
        """Pool replicas woken (or un-parked) into rotation."""
        self.cold_starts = 0
        """Replicas launched (to serve, or to refill the pool)."""
        self.starts = StartTracker()
        self.refilling: set[str] = set()
        """Launched for the pool: put to sleep once they serve, no capacity meanwhile."""
        self.unstopped: set[str] = set()
        """Replicas drained and dropped from the gateway whose stop failed: they serve
        nothing and still cost, so every tick stops them again until the backend does."""
        self._removals: set[asyncio.Task[None]] = set()
        self._changes: dict[str, asyncio.Task[None]] = {}
        """Wakes, and refills being put to sleep, by replica (they do not hold a tick back)."""
        self._task: asyncio.Task[None] | None = None

    # --- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="autoscaler")

    async def stop(self) -> None:
        """The loop, then the removals and pool changes under way (their replicas are left
        as they are: the gateway's own drain on stop covers them), then the backend's waits."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await cancel_all_and_wait([*self._removals, *self._changes.values()])
        self._removals.clear()
        self._changes.clear()
        await self._backend.close()

    async def _run(self) -> None:
        next_tick_s = self._clock() + self.interval_s
        while True:
            await asyncio.sleep(min(_ARRIVALS_EVERY_S, self.interval_s))
            now_s = self._clock()
            self._fleet.count_arrivals(now_s)
            if now_s >= next_tick_s:
                next_tick_s = now_s + self.interval_s
                try:
                    await self.tick()
                except Exception:  # a bug here must not silently end autoscaling
                    log.exception("autoscale tick failed")

    # --- one tick -----------------------------------------------------------------------

    async def tick(self) -> Decision:
        """Ask the policy, record the answer, apply it (unless a removal still drains)."""
        now_s = self._clock()
        await self._stop_unstopped()
        starting = await self._follow_starts(now_s)
        pool = self._fleet.pool()
        self._settle_refills(pool)
        snapshot = self._fleet.snapshot(now_s, starting, frozenset(self.refilling))
        budget = self._adapt_budget(snapshot)
        answer: ScaleDecision = self.policy.decide(snapshot, now_s)
        have = snapshot.provisioned
        desired = max(0, answer.replicas)
        counts = PoolCounts(have, len(pool.held), len(self.refilling | pool.falling_asleep))
        plan = plan_pool(counts, desired, self.pool_target)
        if self.pool_target == 0:
            plan = replace(plan, drop_asleep=0)
        self.last_pool = counts
        decision = Decision(time.time(), have, desired, answer.reason, answer.detail,
                            pool_text(self.pool_target, counts, plan), self.starts.held_line(),
                            budget)  # fmt: skip
        self._record(decision)
        if not plan.idle:
            if self.removing:
                log.info("autoscale: a removal is still draining; no change this tick")
            else:
                await self._apply(plan, snapshot, pool)
        return decision

    def _adapt_budget(self, snapshot: FleetSnapshot) -> BudgetDecision | None:
        """The budget the rate calls for, set on every replica the gateway holds. The policy
        decides on the snapshot taken before: the budgets that served until now."""
        if self.budget is None:
            return None
        chosen = self.budget.decide(snapshot)
        if self._fleet.apply_budget(chosen):
            log.info("autoscale: budget %d per replica (%s)", chosen.budget, chosen.detail)
        return chosen

    async def _stop_unstopped(self) -> None:
        for rid in sorted(self.unstopped):
            try:
                await self._backend.stop(rid)
            except Exception as exc:  # any backend failure: tried again at the next tick
                self._failed(f"stop {rid}", exc)
                continue
            self.unstopped.discard(rid)
            log.info("autoscale: replica %s removed (at a retry)", rid)

    async def _follow_starts(self, now_s: float) -> list[str]:
        """The replicas starting to serve (refills left out), after forgetting those that
        failed and giving up those stuck. A replica that never gets ready (a pod that cannot
        be scheduled, an image that does not pull) would otherwise count as starting for
        ever, and the step rules take no step while one starts: past the startup budget it
        is removed and the policy decides again without it."""
        replicas = self._backend.list()
        for replica in replicas:  # a refill that joined under its own id (a Kubernetes pod)
            if replica.launched_as in self.refilling:
                self.refilling.remove(replica.launched_as)
                self.refilling.add(replica.replica_id)
        listed = {r.replica_id: r.state for r in replicas}
        for rid in self.starts.update(listed, now_s):
            self.refilling.discard(rid)
            log.warning("autoscale: replica %s did not start (%d in a row)%s", rid,
                        self.starts.in_a_row,
                        "; cold starts held" if self.starts.held else "; replacing it")  # fmt: skip
            await self._forget(rid)
        for rid in self.starts.stuck(now_s, self._startup_timeout_s):
            log.warning("autoscale: replica %s still not ready after %g s "
                        "(engine.startup_timeout_s); removing it", rid,
                        self._startup_timeout_s)  # fmt: skip
            if await self._forget(rid):
                self.gave_up += 1
                self.starts.gave_up(rid)
                self.refilling.discard(rid)
                listed.pop(rid, None)
        return [rid for rid, state in listed.items()
                if state is ReplicaState.STARTING and rid not in self.refilling]  # fmt: skip

    async def _forget(self, rid: str) -> bool:
        try:
            await self._backend.stop(rid)
        except Exception as exc:  # any backend failure: tried again at the next tick
            self._failed(f"stop {rid}", exc)
            return False
        return True

    def _settle_refills(self, pool: PoolView) -> None:
        """Put each refill that now serves to sleep (it joined the gateway as any replica)."""
        for rid in sorted(self.refilling & pool.serving):
            self._spawn(rid, self._refill_to_sleep(rid))

    async def _refill_to_sleep(self, rid: str) -> None:
        try:
            await self._fleet.sleep(rid, self._drain_timeout_s)
            log.info("autoscale: replica %s ready and put in the warm pool", rid)
        except Exception as exc:  # it serves then: capacity the next tick sees
            self._failed(f"put {rid} in the warm pool", exc)
        finally:
            self.refilling.discard(rid)

    @property
    def removing(self) -> int:
        """Removals under way (draining, then stopping or sleeping)."""
        return sum(1 for t in self._removals if not t.done())

    async def removals_done(self) -> None:
        """Wait until the removals and pool changes under way have finished."""
        await asyncio.gather(*self._removals, *self._changes.values())

    def _record(self, decision: Decision) -> None:
        self.last = decision
        key = (decision.direction, decision.reason.value)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        log.info(decision.line())
        if self._on_decision is not None:
            self._on_decision(decision)

    async def _apply(self, plan: PoolPlan, snapshot: FleetSnapshot, pool: PoolView) -> None:
        for rid in pool.held[: plan.wake]:
            self._spawn(rid, self._wake(rid))
        await self._launch(plan.start, refill=False)
        await self._launch(plan.refill, refill=True)
        self._shrink(snapshot, pool, plan.sleep, plan.stop)
        for rid in pool.held[len(pool.held) - plan.drop_asleep :]:
            await self._drop_held(rid)

    async def _drop_held(self, rid: str) -> None:
        """Out of the gateway first (nothing in flight), so that no later tick counts it, and
        stops another, while its backend takes it down (a pod terminating); then stopped."""
        try:
            await self._fleet.drain(rid, 0.0)
        except Exception as exc:  # e.g. it left the gateway meanwhile: stop it anyway
            self._failed(f"drain {rid}", exc)
        if not await self._forget(rid):
            self.unstopped.add(rid)
            return
        log.info("autoscale: replica %s stopped (the warm pool is above its target)", rid)

    async def _wake(self, rid: str) -> None:
        try:
            took_s = await self._fleet.wake(rid)
        except Exception as exc:  # it stays in the pool; the next tick decides again
            self._failed(f"wake {rid}", exc)
            return
        self.wakes += 1
        log.info("autoscale: replica %s woken from the warm pool in %.2f s", rid, took_s)

    async def _launch(self, count: int, *, refill: bool) -> None:
        for _ in range(count):
            if self.starts.held:
                log.warning("autoscale: no cold start: %s", self.starts.held_line())
                return
            try:
                (added,) = await self._backend.start(1)
            except Exception as exc:  # any backend failure: the next tick decides again
                self._failed("add a replica", exc)
                return
            self.cold_starts += 1
            self.starts.launched(added, self._clock())
            if refill:
                self.refilling.add(added)
            log.info("autoscale: replica %s launched%s", added,
                     " to refill the warm pool" if refill else "")  # fmt: skip

    def _shrink(self, snapshot: FleetSnapshot, pool: PoolView, sleep: int, stop: int) -> None:
        """Newest first; into the pool while it is short (one still starting becomes a
        refill: its cold start is half paid), the rest stopped. One waking is left be."""
        order = removal_order(snapshot, remove_first_ids(self._backend))
        for replica in [r for r in order if r.replica_id not in pool.waking][: sleep + stop]:
            into_pool = sleep > 0
            sleep -= into_pool
            if into_pool and not replica.ready:
                self.refilling.add(replica.replica_id)
                continue
            task = asyncio.create_task(self._remove(replica, into_pool),
                                       name=f"remove {replica.replica_id}")  # fmt: skip
            self._removals.add(task)
            task.add_done_callback(self._removals.discard)

    def _spawn(self, rid: str, change: Coroutine[Any, Any, None]) -> None:
        """One change at a time per replica."""
        if rid in self._changes:
            change.close()
            return
        task = asyncio.create_task(change, name=f"pool {rid}")
        self._changes[rid] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._changes.get(rid) is finished:
                del self._changes[rid]

        task.add_done_callback(done)

    async def _remove(self, replica: ReplicaSample, into_pool: bool) -> None:
        rid = replica.replica_id
        if into_pool:
            try:
                await self._fleet.sleep(rid, self._drain_timeout_s)
            except Exception as exc:  # it serves again; the next tick decides again
                self._failed(f"put {rid} in the warm pool", exc)
                return
            log.info("autoscale: replica %s put in the warm pool", rid)
            return
        if replica.ready:
            try:
                if not await self._fleet.drain(rid, self._drain_timeout_s):
                    log.warning("autoscale: replica %s still had requests after %g s; "
                                "stopping it", rid, self._drain_timeout_s)  # fmt: skip
            except Exception as exc:  # e.g. it left the gateway meanwhile: stop it anyway
                self._failed(f"drain {rid}", exc)
        else:
            self.starts.withdraw([rid])
        try:
            await self._backend.stop(rid)
        except Exception as exc:
            self._failed(f"stop {rid}", exc)
            if replica.ready:  # out of the gateway now: only a retry stops it
                self.unstopped.add(rid)
            return  # one still starting is the next tick's to decide on again
        log.info("autoscale: replica %s removed", rid)

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        log.warning("autoscale: could not %s: %s: %s", what, type(exc).__name__, exc)


def removal_order(snapshot: FleetSnapshot, first: Collection[str] = ()) -> list[ReplicaSample]:
    """Which replicas go first: those still starting (nothing to drain), then the ready ones
    the backend names in `first` (on Ray, one sharing a node), then the other ready ones;
    newest first within each (the oldest have the warmest prefix caches)."""
    newest_first = list(reversed(snapshot.replicas))
    starting = [r for r in newest_first if not r.ready]
    ready = [r for r in newest_first if r.ready]
    named = [r for r in ready if r.replica_id in first]
    return starting + named + [r for r in ready if r.replica_id not in first]
