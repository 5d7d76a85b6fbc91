"""`up`'s warm pool: once every replica is ready, `replicas.asleep` of them go to sleep (vLLM's
sleep mode), held in host memory until `servepilot wake` (or the autoscaler) brings one into
rotation; where the engine has no sleep mode (vLLM on CPU) they are parked instead: loaded,
running, out of rotation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from servepilot.core.errors import EngineError
from servepilot.fleet.backend import Replica, ReplicaState
from servepilot.fleet.state import ReplicaRecord
from servepilot.gateway.pool import ReplicaPool
from servepilot.gateway.replica import SleepState
from servepilot.gateway.warm import SleepConflict, Transition, WarmPool

# The replicas have just passed their smoke generation: nothing is in flight on them yet.
_DRAIN_TIMEOUT_S = 5.0


def replicas_to_sleep(replica_ids: Sequence[str], asleep: int) -> tuple[str, ...]:
    """The last `asleep` replicas: the first ones (r0, whose log is read first) serve."""
    if asleep <= 0:
        return ()
    return tuple(replica_ids[-asleep:])


def record_rows(replicas: Sequence[Replica], pool: ReplicaPool) -> tuple[ReplicaRecord, ...]:
    """The fleet record's replicas (those whose server's URL is known: a Ray replica not yet
    placed has none), those the gateway holds asleep marked so."""
    asleep = {r.replica_id for r in pool.replicas() if r.sleep.held}
    return tuple(ReplicaRecord(r.replica_id, r.url, r.pid, r.log_path,
                               asleep=r.replica_id in asleep)
                 for r in replicas if r.url and r.state is not ReplicaState.FAILED)  # fmt: skip


def asleep_line(done: Transition) -> str:
    rid = done.replica_id
    how = "parked" if done.sleep is SleepState.PARKED else f"asleep in {done.took_s:.1f} s"
    return f"replica {rid} {how} (warm pool: `servepilot wake {rid}` puts it in rotation)"


async def put_to_sleep(
    warm: WarmPool,
    replica_ids: Sequence[str],
    step: Callable[[str], None],
    warn: Callable[[str], None],
) -> None:
    """Put the replicas to sleep together; one that fails is warned of and keeps serving."""

    async def one(replica_id: str) -> None:
        try:
            done = await warm.sleep(replica_id, level=1, drain_timeout_s=_DRAIN_TIMEOUT_S)
        except (EngineError, SleepConflict) as exc:
            warn(f"replica {replica_id} stays awake: {exc}")
            return
        step(asleep_line(done))

    await asyncio.gather(*(one(r) for r in replica_ids))
