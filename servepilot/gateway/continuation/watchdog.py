"""Streams whose replica went quiet or left the rotation, found on one timer.

A replica that hangs (SIGSTOP, a wedged engine) keeps its connection open: nothing fails, the
stream just stops. A replica the pool took out of rotation (failed health checks) may still
trickle tokens, or never send another. Either way the stream is given up on that replica
(`Relay.abandon`), and the proxy continues it elsewhere.

One timer for every watched stream, ticking at most every second (health is checked every
few seconds anyway); a stream is stalled when the bytes it relayed have not changed for
`stall_timeout_s` since the first token (before it, a long prefill or a queue is not a stall).
The hot path pays nothing: a tick reads the byte count the relay keeps anyway.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from servepilot.gateway.continuation.policy import Failure
from servepilot.http1.errors import UpstreamFailed

_MAX_TICK_S = 1.0


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


@dataclass(slots=True)
class _Seen:
    replica: Health
    progress: int
    since_s: float


class Watchdog:
    """`add` a stream when its exchange starts, `discard` it when it ends."""

    def __init__(self, stall_timeout_s: float) -> None:
        self._stall_s = stall_timeout_s
        self._tick_s = min(stall_timeout_s / 2, _MAX_TICK_S)
        self._seen: dict[Watched, _Seen] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, item: Watched, replica: Health, loop: asyncio.AbstractEventLoop) -> None:
        self._seen[item] = _Seen(replica, item.progress(), loop.time())
        if self._timer is None:
            self._loop = loop
            self._timer = loop.call_later(self._tick_s, self._tick)

    def discard(self, item: Watched) -> None:
        self._seen.pop(item, None)

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        now_s = loop.time()
        for item, seen in list(self._seen.items()):
            failure = self._check(item, seen, now_s)
            if failure is not None:
                del self._seen[item]
                item.abandon(failure)
        if self._seen:
            self._timer = loop.call_later(self._tick_s, self._tick)

    def _check(self, item: Watched, seen: _Seen, now_s: float) -> StreamBroken | None:
        replica_id = seen.replica.replica_id
        progress = item.progress()
        if progress < 0:
            return None  # before the first token: the proxy's retry and timeout cover it
        if not seen.replica.healthy:
            return StreamBroken(Failure.OUT_OF_ROTATION,
                                f"replica {replica_id} was taken out of rotation")  # fmt: skip
        if progress != seen.progress:
            seen.progress, seen.since_s = progress, now_s
            return None
        quiet_s = now_s - seen.since_s
        if quiet_s < self._stall_s:
            return None
        return StreamBroken(Failure.STALL, f"replica {replica_id} sent nothing for {quiet_s:.1f} s")
