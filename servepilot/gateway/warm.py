"""Putting a replica to sleep and waking it (vLLM's sleep mode): the warm pool's mechanism.

Sleep: the replica leaves rotation first (falling asleep), its requests in flight finish
(up to the drain timeout; vLLM aborts what is left), then POST /sleep; it counts as asleep
once GET /is_sleeping says so. Wake: POST /wake_up; it is back in rotation once GET
/is_sleeping says it is awake. Each state changes only on the replica's word, so a request is
never sent to a replica that sleeps; a failure puts it back where it was and says why.

Parking, where the engine has no sleep mode (vLLM on CPU): the same drain, then the replica
is only kept out of rotation (`parked`), still loaded and running; waking it puts it back at
once. `up` turns it on (`WarmPool.parks`) for a pool whose replicas cannot sleep.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from servepilot.core.errors import EngineError
from servepilot.gateway.pool import ReplicaPool, wait_until
from servepilot.gateway.replica import Replica, ReplicaInfo, SleepState

log = logging.getLogger(__name__)

# The first sleep of an 8B model on an H200 takes 11.6 s (pinning the host buffers); a
# larger model takes longer.
CALL_TIMEOUT_S = 300.0
# vLLM answers /sleep and /wake_up once done, but says its older engines may lag behind.
_CONFIRM_TIMEOUT_S = 10.0
_CONFIRM_POLL_S = 0.05


class SleepConflict(ValueError):
    """The replica is not in a state this change applies to (the message says which)."""


@dataclass(frozen=True, slots=True)
class Transition:
    """What putting a replica to sleep, or waking it, did."""

    replica_id: str
    sleep: SleepState
    took_s: float
    """From the call to the replica to its confirmation (the drain before a sleep left out)."""
    drained: bool = True
    """Sleep: whether its requests in flight finished before it was told to sleep."""

    def to_json(self) -> dict[str, object]:
        return {"id": self.replica_id, "sleep": self.sleep.value,
                "took_s": round(self.took_s, 3), "drained": self.drained}  # fmt: skip


class WarmPool:
    """Sleeps and wakes the pool's replicas; tells listeners after each change."""

    def __init__(self, pool: ReplicaPool) -> None:
        self._pool = pool
        self._listeners: list[Callable[[ReplicaInfo], None]] = []
        self.parks = False
        """Park instead of sleeping: the replicas have no sleep mode (vLLM on CPU)."""

    def on_change(self, listener: Callable[[ReplicaInfo], None]) -> None:
        """Call `listener(the replica's new state)` after each change (`up` rewrites the
        fleet record)."""
        self._listeners.append(listener)

    async def sleep(self, replica_id: str, level: int, drain_timeout_s: float) -> Transition:
        """Take the replica out of rotation, let its requests finish, put it to sleep (or
        park it: `parks`). ReplicaNotFound, SleepConflict, EngineError (it is left as it
        says it is: back in rotation unless it sleeps after all)."""
        replica = self._pool.live(replica_id)
        self._check_can_sleep(replica)
        replica.sleep = SleepState.FALLING_ASLEEP
        try:
            drained = await wait_until(lambda: replica.in_flight == 0, drain_timeout_s)
            if self.parks:
                return self._changed(replica, SleepState.PARKED, 0.0, drained)
            took_s = await self._call(replica, f"/sleep?level={level}", sleeping=True)
        except EngineError:
            await self._settle(replica, SleepState.AWAKE)
            raise
        except BaseException:
            replica.sleep = SleepState.AWAKE
            raise
        return self._changed(replica, SleepState.ASLEEP, took_s, drained)

    async def wake(self, replica_id: str) -> Transition:
        """Wake the replica; in rotation once it says it is awake. ReplicaNotFound,
        SleepConflict, EngineError (it stays asleep then, unless it says it is awake)."""
        replica = self._pool.live(replica_id)
        if replica.sleep is SleepState.PARKED:
            return self._changed(replica, SleepState.AWAKE, 0.0, True)
        if replica.sleep is not SleepState.ASLEEP:
            raise SleepConflict(f"replica {replica_id} is {replica.sleep.value}, not asleep")
        replica.sleep = SleepState.WAKING
        try:
            took_s = await self._call(replica, "/wake_up", sleeping=False)
        except EngineError:
            await self._settle(replica, SleepState.ASLEEP)
            raise
        except BaseException:
            replica.sleep = SleepState.ASLEEP
            raise
        return self._changed(replica, SleepState.AWAKE, took_s, True)

    async def recognise(self, replica_id: str) -> SleepState:
        """Take an awake replica's word (GET /is_sleeping) on whether it sleeps: a gateway
        started in front of replicas another put to sleep (a Kubernetes gateway restarted)
        must not route to one asleep. ReplicaNotFound."""
        replica = self._pool.live(replica_id)
        if replica.sleep is SleepState.AWAKE:
            await self._settle(replica, SleepState.AWAKE)
        return replica.sleep

    def _check_can_sleep(self, replica: Replica) -> None:
        name = f"replica {replica.replica_id}"
        if replica.sleep is not SleepState.AWAKE:
            raise SleepConflict(f"{name} is {replica.sleep.value}, not awake")
        if not replica.serving:
            raise SleepConflict(f"{name} is not in rotation (down or draining)")
        others = [
            r for r in self._pool.replicas() if r.serving and r.replica_id != replica.replica_id
        ]
        if not others:
            raise SleepConflict(f"{name} is the last replica serving; wake another first")

    def _changed(
        self, replica: Replica, state: SleepState, took_s: float, drained: bool
    ) -> Transition:
        replica.sleep = state
        done = Transition(replica.replica_id, state, took_s, drained)
        log.info("replica %s is %s (took %.2f s)%s", replica.replica_id, state.value, took_s,
                 "" if drained else "; requests in flight were aborted")  # fmt: skip
        self._tell(replica)
        return done

    def _tell(self, replica: Replica) -> None:
        info = replica.info()
        for listener in self._listeners:
            listener(info)

    async def _settle(self, replica: Replica, otherwise: SleepState) -> None:
        """After a failed call (a timeout may hide a sleep that went through): the state
        the replica's GET /is_sleeping gives, else `otherwise`. A replica that sleeps must
        not be routed to; one awake but not in rotation only wastes its GPU until woken."""
        timeout = aiohttp.ClientTimeout(total=_CONFIRM_TIMEOUT_S)
        try:
            async with self._pool.session.get(
                replica.endpoint("/is_sleeping"), timeout=timeout
            ) as resp:
                doc = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            doc = None
        said = doc.get("is_sleeping") if isinstance(doc, dict) else None
        if said is True:
            replica.sleep = SleepState.ASLEEP
        elif said is False:
            replica.sleep = SleepState.AWAKE
        else:
            replica.sleep = otherwise
        self._tell(replica)

    async def _call(self, replica: Replica, path: str, *, sleeping: bool) -> float:
        """POST `path`, then wait for GET /is_sleeping to say `sleeping`; the seconds taken."""
        what = "sleep" if sleeping else "wake up"
        started_s = time.monotonic()
        session, timeout = self._pool.session, aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
        try:
            async with session.post(replica.endpoint(path), timeout=timeout) as resp:
                if resp.status != 200:
                    raise _refused(replica, what, path, resp.status)
            confirmed = await _confirm(session, replica, sleeping)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise EngineError(f"replica {replica.replica_id} did not {what}: "
                              f"{type(exc).__name__}: {exc}") from None  # fmt: skip
        if not confirmed:
            raise EngineError(
                f"replica {replica.replica_id} did not {what}: GET /is_sleeping still says "
                f"{not sleeping} after {_CONFIRM_TIMEOUT_S:g} s"
            )
        return time.monotonic() - started_s


async def _confirm(session: aiohttp.ClientSession, replica: Replica, sleeping: bool) -> bool:
    """Whether GET /is_sleeping comes to say `sleeping` within the confirmation window."""
    deadline_s = time.monotonic() + _CONFIRM_TIMEOUT_S
    timeout = aiohttp.ClientTimeout(total=_CONFIRM_TIMEOUT_S)
    while True:
        async with session.get(replica.endpoint("/is_sleeping"), timeout=timeout) as resp:
            if resp.status != 200:
                raise _refused(replica, "answer", "/is_sleeping", resp.status)
            doc = await resp.json(content_type=None)
        if isinstance(doc, dict) and doc.get("is_sleeping") is sleeping:
            return True
        if time.monotonic() >= deadline_s:
            return False
        await asyncio.sleep(_CONFIRM_POLL_S)


def _refused(replica: Replica, what: str, path: str, status: int) -> EngineError:
    hint = None
    if status == 404:
        hint = ("start the replicas with engine.sleep_mode: true (vLLM: --enable-sleep-mode and "
                "VLLM_SERVER_DEV_MODE=1, which serve its sleep routes)")  # fmt: skip
    return EngineError(
        f"replica {replica.replica_id} did not {what}: {path} answered HTTP {status}", hint=hint
    )
