"""The continuation watchdog: a stream silent for the stall deadline is given up on (within
it of its last byte, at most a tick before), its replica reported; a replica out of rotation
loses its streams, answered or not; a stream that keeps going is left alone; and the timer
stops with the last stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from servepilot.gateway.continuation.policy import Failure
from servepilot.gateway.continuation.watchdog import StreamBroken, Watchdog
from servepilot.http1.errors import UpstreamFailed

STALL_S = 0.3
TICK_S = 0.1
SLACK_S = 0.03
"""A timer's lateness on a loaded test machine."""


@dataclass
class _Replica:
    replica_id: str
    healthy: bool = True


@dataclass(eq=False)
class _Stream:
    """A relay as the watchdog reads it: bytes relayed so far, and what it was given up for."""

    bytes_relayed: int = -1
    abandoned: list[tuple[float, UpstreamFailed]] = field(default_factory=list)
    last_byte_s: float = 0.0

    def progress(self) -> int:
        return self.bytes_relayed

    def abandon(self, failure: UpstreamFailed) -> None:
        self.abandoned.append((asyncio.get_running_loop().time(), failure))

    def relay(self) -> None:
        self.bytes_relayed = max(self.bytes_relayed, 0) + 10
        self.last_byte_s = asyncio.get_running_loop().time()


def test_a_silent_stream_is_given_up_after_the_deadline_and_a_lively_one_is_not() -> None:
    stalls: list[tuple[str, str]] = []

    async def body() -> None:
        loop = asyncio.get_running_loop()
        watchdog = Watchdog(STALL_S, lambda rid, why: stalls.append((rid, why)))
        hung, lively = _Stream(), _Stream()
        watchdog.add(hung, _Replica("r0"), loop)
        watchdog.add(lively, _Replica("r1"), loop)
        for _ in range(10):  # both stream for 0.5 s, then r0 goes quiet
            hung.relay()
            lively.relay()
            await asyncio.sleep(0.05)
        for _ in range(20):  # 1 s more: r1 goes on
            lively.relay()
            await asyncio.sleep(0.05)
        assert len(hung.abandoned) == 1 and not lively.abandoned
        when_s, failure = hung.abandoned[0]
        assert isinstance(failure, StreamBroken) and failure.kind is Failure.STALL
        # Within the deadline of its last byte (a hung replica's streams go on within it and
        # one TTFT), and at most one tick (0.1 s) before it: the tick sees that a byte came,
        # not when.
        assert STALL_S - TICK_S - SLACK_S <= when_s - hung.last_byte_s <= STALL_S + SLACK_S
        assert [rid for rid, _ in stalls] == ["r0"]
        assert len(watchdog) == 1
        watchdog.discard(lively)
        assert len(watchdog) == 0

    asyncio.run(body())


def test_a_replica_out_of_rotation_loses_its_streams_answered_or_not() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        watchdog = Watchdog(STALL_S)
        replica = _Replica("r0")
        waiting, answering = _Stream(), _Stream()
        watchdog.add(waiting, replica, loop)
        watchdog.add(answering, replica, loop)
        answering.relay()
        await asyncio.sleep(0.25)
        assert not waiting.abandoned and not answering.abandoned  # a long prefill: no stall
        replica.healthy = False
        await asyncio.sleep(0.25)
        for stream in (waiting, answering):
            assert [f.kind for _, f in stream.abandoned] == [Failure.OUT_OF_ROTATION]  # type: ignore[attr-defined]
        assert len(watchdog) == 0

    asyncio.run(body())


def test_the_timer_stops_with_the_last_stream_and_starts_with_the_next() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        watchdog = Watchdog(STALL_S)
        first = _Stream()
        watchdog.add(first, _Replica("r0"), loop)
        watchdog.discard(first)
        await asyncio.sleep(0.3)  # a tick finds nothing and leaves no timer behind
        assert watchdog._timer is None
        second = _Stream()
        watchdog.add(second, _Replica("r0"), loop)
        second.relay()
        await asyncio.sleep(STALL_S + 0.4)
        assert [f.kind for _, f in second.abandoned] == [Failure.STALL]  # type: ignore[attr-defined]

    asyncio.run(body())


def test_a_loop_held_up_does_not_make_a_lively_stream_look_stalled() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        watchdog = Watchdog(STALL_S)
        stream = _Stream()
        watchdog.add(stream, _Replica("r0"), loop)
        stream.relay()
        await asyncio.sleep(0.15)
        time.sleep(2 * STALL_S)  # noqa: ASYNC251 - the loop held up (a long GC, a blocking call)
        stream.relay()  # ... and a byte came at its end
        for _ in range(10):  # then it streams on
            await asyncio.sleep(0.05)
            stream.relay()
        assert not stream.abandoned
        watchdog.discard(stream)

    asyncio.run(body())
