"""The `ReplicaBackend` contract as one check that any implementation must pass, given a
harness that plays the platform's part (test_replica_backend.py runs it against the local and
Kubernetes backends, tests/integration/test_ray_backend.py against Ray's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from servepilot.fleet.backend import (
    Joined,
    Left,
    ReplicaBackend,
    ReplicaEvent,
    ReplicaState,
    Synced,
    starting_ids,
)


class Harness(Protocol):
    """A backend with one replica serving, and the platform's part a test plays."""

    backend: ReplicaBackend

    async def serve(self, started_id: str) -> None:
        """Let a replica just started get ready (Kubernetes: its pod's endpoint turns ready)."""
        ...

    async def gone(self, replica_id: str) -> None:
        """The platform removes a replica the backend stopped (Kubernetes: its pod goes)."""
        ...


class Events:
    """A backend's watch, read in the background."""

    def __init__(self, backend: ReplicaBackend) -> None:
        self._queue: asyncio.Queue[ReplicaEvent] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._pump(backend))

    async def _pump(self, backend: ReplicaBackend) -> None:
        async for event in backend.watch():
            await self._queue.put(event)

    async def next(self, timeout_s: float = 30.0) -> ReplicaEvent:
        return await asyncio.wait_for(self._queue.get(), timeout_s)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _ids(backend: ReplicaBackend, state: ReplicaState) -> set[str]:
    return {r.replica_id for r in backend.list() if r.state is state}


async def conforms(harness: Harness) -> None:
    backend = harness.backend
    events = Events(backend)
    try:
        # The watch lists first: a Joined for each replica serving, then Synced.
        first: list[ReplicaEvent] = []
        while not isinstance(event := await events.next(), Synced):
            first.append(event)
        serving = _ids(backend, ReplicaState.READY)
        assert serving and {e.replica_id for e in first if isinstance(e, Joined)} == serving
        assert all(isinstance(e, Joined) and e.url for e in first)

        # A replica started is starting until one joins; then it serves.
        (added,) = await backend.start(1)
        assert starting_ids(backend) == (added,)
        await harness.serve(added)
        joined = await events.next()
        assert isinstance(joined, Joined) and joined.replica_id not in serving
        await until(lambda: starting_ids(backend) == ())
        assert _ids(backend, ReplicaState.READY) == serving | {joined.replica_id}

        # A replica stopped leaves.
        await backend.stop(joined.replica_id)
        await harness.gone(joined.replica_id)
        left = await events.next()
        assert isinstance(left, Left) and left.replica_id == joined.replica_id
        await until(lambda: joined.replica_id not in {r.replica_id for r in backend.list()})

        # One stopped while still starting never joins.
        (again,) = await backend.start(1)
        await backend.stop(again)
        assert starting_ids(backend) == ()
        await backend.close()
        assert _ids(backend, ReplicaState.READY) == serving
    finally:
        await events.stop()
