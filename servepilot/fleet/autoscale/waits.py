"""The tasks that wait for added replicas to get ready: one per replica, owned by the backend
that launched it, cancelled when the replica is removed before it is ready or when the
controller stops (the backends of every cluster share this bookkeeping)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from servepilot.core.loop import cancel_all_and_wait, cancel_and_wait


class StartWaits:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def ids(self) -> tuple[str, ...]:
        """Replicas still waited for, oldest first."""
        return tuple(self._tasks)

    def start(self, replica_id: str, wait: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(wait, name=f"start {replica_id}")
        self._tasks[replica_id] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._tasks.get(replica_id) is finished:
                del self._tasks[replica_id]

        task.add_done_callback(done)

    def discard(self, replica_id: str) -> None:
        """The wait is over for this replica (it joined, or it is being given up)."""
        self._tasks.pop(replica_id, None)

    async def cancel(self, replica_id: str) -> None:
        task = self._tasks.pop(replica_id, None)
        if task is not None:
            await cancel_and_wait(task)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        await cancel_all_and_wait(tasks)
