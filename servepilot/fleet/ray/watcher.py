"""Follows the replica actors as Ray loses and restarts them: the Ray backend's watch
(`backend.RayBackend`, whose `Membership` turns a join and a leave into its watch's events).

One task per replica follows its actor: it waits until the actor's server is ready, has it join
(the gateway adds it), then waits for the server or the actor to go, and has it leave (the
gateway drains, then drops it). A replica that Ray restarts, on the same node or on another one
after a node loss, comes back as a new incarnation, possibly at a new URL, and is added again. A
replica the autoscaler adds is followed from its start (`follow`); one it removes is let go
before its actor is killed (`forget`). The tasks belong to the watcher and are cancelled, then
awaited, by `stop()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from servepilot.core.loop import cancel_all_and_wait, cancel_and_wait
from servepilot.fleet.backend import ReplicaState
from servepilot.fleet.ray.actor import ActorReady

log = logging.getLogger(__name__)

# A replica whose actor is gone cannot finish its requests (they fail fast, their server is
# dead); this only bounds the drain on a replica that went away half-alive.
LEAVE_DRAIN_S = 5.0
RETRY_S = 1.0


class ReplicaUnavailable(Exception):
    """The replica's actor is dead, restarting, or its call failed."""


class FollowedReplica(Protocol):
    @property
    def replica_id(self) -> str: ...

    async def ready(self) -> ActorReady: ...

    async def until_exit(self) -> int: ...

    def restart(self) -> None: ...


class Membership(Protocol):
    """Where replicas join and leave (the Ray backend's watch)."""

    async def join(self, replica_id: str, answer: ActorReady) -> None: ...

    async def leave(self, replica_id: str) -> None: ...


class ReplicaWatcher:
    def __init__(
        self,
        replicas: Sequence[FollowedReplica],
        membership: Membership,
        warn: Callable[[str], None],
        step: Callable[[str], None],
        retry_s: float = RETRY_S,
    ) -> None:
        self._replicas = replicas
        self._membership = membership
        self._warn = warn
        self._step = step
        self._retry_s = retry_s
        self._seen: dict[str, str] = {}
        """replica id -> the incarnation that served last."""
        self._in_gateway: set[str] = set()
        self._lost_at: dict[str, float] = {}
        """When each replica now gone was lost (monotonic seconds): recovery time is said."""
        self.states: dict[str, ReplicaState] = {
            r.replica_id: ReplicaState.STARTING for r in replicas
        }
        self.restarts: dict[str, int] = {r.replica_id: 0 for r in replicas}
        self.answers: dict[str, ActorReady] = {}
        """What each replica answered when it last became ready (its node, its URL)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, joined: Mapping[str, ActorReady]) -> None:
        """Follow every replica; `joined`: those already in the gateway, as they answered."""
        for replica_id, answer in joined.items():
            self._seen[replica_id] = answer.incarnation
            self._in_gateway.add(replica_id)
            self.states[replica_id] = ReplicaState.READY
            self.answers[replica_id] = answer
        for replica in self._replicas:
            self.follow(replica)

    def follow(self, replica: FollowedReplica) -> None:
        """Follow one more replica (the autoscaler's): it joins the gateway once ready."""
        replica_id = replica.replica_id
        self.states.setdefault(replica_id, ReplicaState.STARTING)
        self.restarts.setdefault(replica_id, 0)
        self._tasks[replica_id] = asyncio.ensure_future(self._follow(replica))

    async def forget(self, replica_id: str) -> None:
        """Stop following a replica that is being removed (the autoscaler drained it at the
        gateway; one still there is dropped), before its actor is killed: its end is no loss."""
        task = self._tasks.pop(replica_id, None)
        if task is not None:
            await cancel_and_wait(task)
        await self._leave(replica_id)
        for known in (self._seen, self._lost_at, self.states, self.restarts, self.answers):
            known.pop(replica_id, None)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        await cancel_all_and_wait(tasks)
        self._tasks = {}

    async def _follow(self, replica: FollowedReplica) -> None:
        while True:
            try:
                answer = await replica.ready()
                if answer.info is None:
                    await self._failed(replica, answer)
                else:
                    await self._serve(replica, answer)
            except ReplicaUnavailable as exc:
                await self._lost(replica.replica_id, str(exc))
            await asyncio.sleep(self._retry_s)

    async def _serve(self, replica: FollowedReplica, answer: ActorReady) -> None:
        replica_id = replica.replica_id
        previous = self._seen.get(replica_id)
        if previous != answer.incarnation or replica_id not in self._in_gateway:
            await self._leave(replica_id)  # an incarnation the watcher saw no loss of
            await self._membership.join(replica_id, answer)
            self._in_gateway.add(replica_id)
            self._seen[replica_id] = answer.incarnation
            if previous is not None and previous != answer.incarnation:
                self.restarts[replica_id] += 1
            url = answer.info.url if answer.info else "?"
            lost_at = self._lost_at.pop(replica_id, None)
            after = f", {time.monotonic() - lost_at:.1f} s after it was lost" if lost_at else ""
            again = " again" if previous is not None else ""
            self._step(
                f"replica {replica_id} serves{again} at {url} (node {answer.node_ip}){after}"
            )
        self.states[replica_id] = ReplicaState.READY
        self.answers[replica_id] = answer
        code = await replica.until_exit()
        await self._lost(replica_id, f"its server exited with code {code}")

    async def _failed(self, replica: FollowedReplica, answer: ActorReady) -> None:
        self.states[replica.replica_id] = ReplicaState.FAILED
        self._warn(f"replica {replica.replica_id} did not start again: {answer.failure}")
        replica.restart()

    async def _lost(self, replica_id: str, why: str) -> None:
        if self.states[replica_id] is not ReplicaState.LOST:
            self._lost_at.setdefault(replica_id, time.monotonic())
            self._warn(f"replica {replica_id} lost ({why}); the gateway routes around it")
        self.states[replica_id] = ReplicaState.LOST
        await self._leave(replica_id)

    async def _leave(self, replica_id: str) -> None:
        if replica_id in self._in_gateway:
            self._in_gateway.discard(replica_id)
            await self._membership.leave(replica_id)
