"""The controller: every `interval_s` it asks a scaling policy how many replicas the fleet
should have and makes it so through the fleet's `ReplicaBackend` (`fleet.backend`).

More replicas: the backend launches them; each joins the gateway once ready (until then it
counts as starting, so the policy sees the capacity on its way). Fewer: replicas still
starting go first, newest first, then the ready ones the backend wants back first (on Ray,
one sharing a node), then the newest ready ones, each drained at the gateway
(no new requests; those in flight finish, up to `drain_timeout_s`) before the backend stops
it. While a removal drains, the controller keeps deciding (the policies' windows need every
tick) but changes nothing. A backend that fails is logged and counted; the next tick decides
afresh and tries again.

Its one task is owned: `start` makes it, `stop` ends it, then the removals under way, then the
backend's waits for starting replicas, in that order, without waiting on any drain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from servepilot.core.loop import cancel_all_and_wait, cancel_and_wait
from servepilot.fleet.backend import ReplicaBackend, remove_first_ids, starting_ids
from servepilot.scaling.snapshot import (
    AutoscalePolicy,
    FleetSnapshot,
    ReplicaSample,
    ScaleDecision,
    ScaleReason,
)

log = logging.getLogger(__name__)

_ARRIVALS_EVERY_S = 1.0
"""The arrival history's resolution: a forecast reads arrivals per second."""


class FleetView(Protocol):
    """What the controller reads from, and asks of, the gateway (`view.GatewayView`)."""

    def count_arrivals(self, now_s: float) -> None: ...

    def snapshot(self, now_s: float) -> FleetSnapshot: ...

    async def drain(self, replica_id: str, timeout_s: float) -> bool: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """One tick's answer, as logged, exported and shown by `status`."""

    at_s: float
    """Unix time."""
    current: int
    """Replicas ready or starting when it was taken."""
    desired: int
    reason: ScaleReason
    detail: str

    @property
    def direction(self) -> str:
        if self.desired == self.current:
            return "hold"
        return "up" if self.desired > self.current else "down"

    def line(self) -> str:
        change = (
            f"{self.current} replicas" if self.direction == "hold"
            else f"{self.current} -> {self.desired} replicas"
        )  # fmt: skip
        return f"autoscale: {change} ({self.reason.value}: {self.detail})"


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
        clock: Callable[[], float] = time.monotonic,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        """`clock`: the policy's time (the gateway's: time.monotonic); `on_decision` hears
        every decision after it is logged and counted (`up` reports changes);
        `startup_timeout_s`: how long a replica may stay starting before it is given up."""
        self.policy = policy
        self._backend = backend
        self._fleet = fleet
        self.interval_s = interval_s
        self._drain_timeout_s = drain_timeout_s
        self._startup_timeout_s = startup_timeout_s
        self._clock = clock
        self._on_decision = on_decision
        self.last: Decision | None = None
        self.decisions: dict[tuple[str, str], int] = {}
        """Decisions taken, by (direction, reason)."""
        self.errors = 0
        """Changes the backend (or a drain) failed to make."""
        self.gave_up = 0
        """Replicas removed because they were still starting past startup_timeout_s."""
        self._starting_since: dict[str, float] = {}
        self.unstopped: set[str] = set()
        """Replicas drained and dropped from the gateway whose stop failed: they serve
        nothing and still cost, so every tick stops them again until the backend does."""
        self._removals: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    # --- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="autoscaler")

    async def stop(self) -> None:
        """The loop, then the removals under way (their replicas are left draining: the
        gateway's own drain on stop covers them), then the backend's waits."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await cancel_all_and_wait(list(self._removals))
        self._removals.clear()
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
        await self._give_up_stuck(now_s)
        snapshot = self._fleet.snapshot(now_s)
        answer: ScaleDecision = self.policy.decide(snapshot, now_s)
        have = snapshot.provisioned
        decision = Decision(time.time(), have, max(0, answer.replicas), answer.reason,
                            answer.detail)  # fmt: skip
        self._record(decision)
        if decision.desired != have:
            if self.removing:
                log.info("autoscale: a removal is still draining; no change this tick")
            else:
                await self._scale_to(decision.desired, snapshot)
        return decision

    async def _stop_unstopped(self) -> None:
        for rid in sorted(self.unstopped):
            try:
                await self._backend.stop(rid)
            except Exception as exc:  # any backend failure: tried again at the next tick
                self._failed(f"stop {rid}", exc)
                continue
            self.unstopped.discard(rid)
            log.info("autoscale: replica %s removed (at a retry)", rid)

    async def _give_up_stuck(self, now_s: float) -> None:
        """A replica that never gets ready (a pod that cannot be scheduled, an image that does
        not pull) would otherwise count as starting for ever, and the step rules take no step
        while one starts: the fleet would stop scaling. Past the startup budget it is removed
        and the policy decides again without it."""
        starting = starting_ids(self._backend)
        since = {rid: self._starting_since.get(rid, now_s) for rid in starting}
        self._starting_since = since
        for rid, first_seen_s in list(since.items()):
            if now_s - first_seen_s <= self._startup_timeout_s:
                continue
            log.warning("autoscale: replica %s still not ready after %g s "
                        "(engine.startup_timeout_s); removing it", rid,
                        self._startup_timeout_s)  # fmt: skip
            try:
                await self._backend.stop(rid)
            except Exception as exc:  # any backend failure: tried again at the next tick
                self._failed(f"stop {rid}", exc)
                continue
            self.gave_up += 1
            del self._starting_since[rid]

    @property
    def removing(self) -> int:
        """Removals under way (draining, then stopping)."""
        return sum(1 for t in self._removals if not t.done())

    async def removals_done(self) -> None:
        """Wait until the removals under way have finished (drained and stopped)."""
        await asyncio.gather(*self._removals)

    def _record(self, decision: Decision) -> None:
        self.last = decision
        key = (decision.direction, decision.reason.value)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        log.info(decision.line())
        if self._on_decision is not None:
            self._on_decision(decision)

    async def _scale_to(self, desired: int, snapshot: FleetSnapshot) -> None:
        have = snapshot.provisioned
        for _ in range(desired - have):
            try:
                (added,) = await self._backend.start(1)
            except Exception as exc:  # any backend failure: the next tick decides again
                self._failed("add a replica", exc)
                return
            self._starting_since[added] = self._clock()
            log.info("autoscale: replica %s launched", added)
        order = removal_order(snapshot, remove_first_ids(self._backend))
        for replica in order[: max(0, have - desired)]:
            task = asyncio.create_task(self._remove(replica), name=f"remove {replica.replica_id}")
            self._removals.add(task)
            task.add_done_callback(self._removals.discard)

    async def _remove(self, replica: ReplicaSample) -> None:
        rid = replica.replica_id
        if replica.ready:
            try:
                if not await self._fleet.drain(rid, self._drain_timeout_s):
                    log.warning("autoscale: replica %s still had requests after %g s; "
                                "stopping it", rid, self._drain_timeout_s)  # fmt: skip
            except Exception as exc:  # e.g. it left the gateway meanwhile: stop it anyway
                self._failed(f"drain {rid}", exc)
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
