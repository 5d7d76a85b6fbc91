"""Streams whose replica went quiet or left the rotation, found on one timer.

A replica that hangs (SIGSTOP, a wedged engine) keeps its connection open: nothing fails, the
stream just stops. A replica the pool took out of rotation (failed health checks) may still
trickle tokens, or never send another. Either way the stream is given up on that replica
(`Relay.abandon`), and the proxy continues it elsewhere.

One timer for every watched stream, ticking every tenth of a second at most, and at the
earliest stall deadline when that comes first. A tick reads one integer per stream (the bytes
relayed): it sees that a byte came since the last tick, not when. The deadline runs from the
last tick before the change, so a hung replica's streams go on within `stall_timeout_s` of
their last byte and one TTFT (the bound the gateway promises), at the cost of giving up on a
stream up to one tick (0.1 s) early: a stream is stalled when the bytes it relayed have not
changed for between `stall_timeout_s` less a tick and `stall_timeout_s` since the first token
(before it, a long prefill or a queue is not a stall,
but a replica out of rotation is given up on all the same: a request it had not answered at
all is retried elsewhere, one whose head had come is continued from its start).
The hot path pays nothing: a tick reads the byte count the relay keeps anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from servepilot.gateway.continuation.policy import Failure
from servepilot.http1.errors import UpstreamFailed

_MAX_TICK_S = 0.1


class StreamBroken(UpstreamFailed):
    """The gateway gave up on a replica mid-answer (`kind`: why)."""

    def __init__(self, kind: Failure, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Watched(Protocol):
    def progress(self) -> int:
        """Body bytes relayed so far; -1 before the first chunk."""
        ...

    def abandon(self, failure: UpstreamFailed) -> None: ...


class Health(Protocol):
    @property
    def healthy(self) -> bool: ...

    @property
    def replica_id(self) -> str: ...


_Seen = tuple[Health, int, float]
"""The replica, the bytes relayed when last seen to change, and the last tick before that
change (a tuple: one is made per streamed request, and a tuple is the cheapest record to
make)."""


class Watchdog:
    """`add` a stream when its exchange starts, `discard` it when it ends.

    A stall is the replica's, not the stream's: its engine makes no step (hung, wedged), so
    `on_stall(replica_id, why)` is told (the pool takes it out of rotation until a health check
    passes again), and its streams still waiting for a first token are given up at the next
    tick instead of when its health checks fail, seconds later."""

    def __init__(
        self, stall_timeout_s: float, on_stall: Callable[[str, str], None] | None = None
    ) -> None:
        self._stall_s = stall_timeout_s
        self._on_stall = on_stall
        self._tick_s = min(stall_timeout_s / 2, _MAX_TICK_S)
        self._seen: dict[Watched, _Seen] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_tick_s = 0.0
        """When the counts were last read (or the timer started): a byte seen at a tick came
        after it."""

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, item: Watched, replica: Health, loop: asyncio.AbstractEventLoop) -> None:
        # Once per streamed request: no call into the relay (nothing is relayed yet), and no
        # clock read but when the timer starts.
        self._seen[item] = (replica, -1, 0.0)
        if self._timer is None:
            self._loop = loop
            self._last_tick_s = loop.time()
            self._timer = loop.call_later(self._tick_s, self._tick)

    def discard(self, item: Watched) -> None:
        self._seen.pop(item, None)

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        now_s = loop.time()
        next_s = now_s + self._tick_s
        # A loop held up for longer than a tick must not make a byte that just came look old.
        before_s = max(self._last_tick_s, now_s - self._tick_s)
        self._last_tick_s = now_s
        seen = self._seen
        for item, (replica, last, since_s) in list(seen.items()):
            progress = item.progress()
            if progress < 0:
                # Before the first token a long prefill or queue is no stall, but a replica
                # out of rotation (a hung one fails its checks) will not answer.
                if not replica.healthy:
                    del seen[item]
                    item.abandon(self._out_of_rotation(replica))
                continue
            if progress != last:
                seen[item] = (replica, progress, before_s)
                since_s = before_s
            failure = self._check(replica, now_s - since_s)
            if failure is None:
                next_s = min(next_s, since_s + self._stall_s)
                continue
            del seen[item]
            item.abandon(failure)
            if failure.kind is Failure.STALL and self._on_stall is not None:
                self._on_stall(replica.replica_id, str(failure))
        if seen:
            self._timer = loop.call_at(next_s, self._tick)

    def _check(self, replica: Health, quiet_s: float) -> StreamBroken | None:
        if not replica.healthy:
            return self._out_of_rotation(replica)
        if quiet_s < self._stall_s:
            return None
        message = f"replica {replica.replica_id} sent nothing for {quiet_s:.1f} s"
        return StreamBroken(Failure.STALL, message)

    @staticmethod
    def _out_of_rotation(replica: Health) -> StreamBroken:
        message = f"replica {replica.replica_id} was taken out of rotation"
        return StreamBroken(Failure.OUT_OF_ROTATION, message)
