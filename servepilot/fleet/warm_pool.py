"""`up`'s warm pool: once every replica is ready, `replicas.asleep` of them go to sleep (vLLM's
sleep mode), held in host memory until `servepilot wake` brings one into rotation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from servepilot.core.errors import EngineError
from servepilot.engine.process import ReplicaProcess
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


def record_rows(
    processes: Sequence[ReplicaProcess], pool: ReplicaPool
) -> tuple[ReplicaRecord, ...]:
    """The fleet record's replicas, those the gateway holds asleep marked so."""
    asleep = {r.replica_id for r in pool.replicas() if r.sleep is SleepState.ASLEEP}
    return tuple(ReplicaRecord(p.replica_id, p.url, p.pid or 0, str(p.log_path),
                               asleep=p.replica_id in asleep)
                 for p in processes)  # fmt: skip


def asleep_line(done: Transition) -> str:
    rid = done.replica_id
    return (
        f"replica {rid} asleep in {done.took_s:.1f} s (warm pool: `servepilot wake {rid}` "
        "puts it in rotation)"
    )


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
