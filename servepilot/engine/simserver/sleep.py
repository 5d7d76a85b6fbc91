"""vLLM's sleep mode on the simulated replica: POST /sleep, POST /wake_up, GET /is_sleeping.

What vLLM 0.22 does (with --enable-sleep-mode, and VLLM_SERVER_DEV_MODE=1 for the routes):
- POST /sleep?level=N pauses its scheduler; level 1 moves the weights to pinned host memory
  and drops the KV cache, level 2 drops the weights too, level 0 only pauses. It answers 200
  with an empty body once done.
- POST /wake_up brings back what its `tags` name (weights, kv_cache, scheduling; all without
  any), 200 with an empty body.
- GET /is_sleeping answers {"is_sleeping": bool}: true until everything is back.
- A generation request that arrives meanwhile is accepted and waits in the paused scheduler
  until the replica is woken; /health answers 200 all along.

The simulated replica does the same, taking the time its flags say (--first-sleep-s: the
first sleep pins the host buffers; --sleep-s, --wake-s). One difference: vLLM's default
mode=abort aborts the requests in flight, here they finish first (vLLM's mode=wait), which
is what the gateway does anyway before it puts a replica to sleep.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
from dataclasses import dataclass
from urllib.parse import parse_qs

from servepilot.engine.simserver.openai_api import bad_request
from servepilot.engine.simserver.realtime import RealtimeEngine

_IDLE_POLL_S = 0.01
_MODES = ("abort", "wait", "keep")


class SleepTag(enum.StrEnum):
    """What vLLM's wake_up can bring back on its own."""

    WEIGHTS = "weights"
    KV_CACHE = "kv_cache"
    SCHEDULING = "scheduling"


@dataclass(frozen=True, slots=True)
class SleepTimes:
    first_sleep_s: float
    sleep_s: float
    wake_s: float


def sleep_times(args: argparse.Namespace) -> SleepTimes | None:
    """The sleep model of the flags; None without --enable-sleep-mode (no sleep routes)."""
    if not args.enable_sleep_mode:
        return None
    return SleepTimes(args.first_sleep_s, args.sleep_s, args.wake_s)


def tags_put_to_sleep(level: int) -> frozenset[SleepTag]:
    """Level 0 pauses the scheduler alone; levels 1 and 2 free the GPU memory too."""
    return frozenset({SleepTag.SCHEDULING}) if level == 0 else frozenset(SleepTag)


def sleep_duration_s(times: SleepTimes, level: int, slept_before: bool) -> float:
    if level == 0:
        return 0.0
    return times.sleep_s if slept_before else times.first_sleep_s


def wake_duration_s(times: SleepTimes, woken: frozenset[SleepTag]) -> float:
    """The weights' copy back dominates; the KV cache is only reallocated."""
    return times.wake_s if SleepTag.WEIGHTS in woken else 0.0


def parse_level(query: str) -> int:
    params = parse_qs(query)
    raw = params.get("level", ["1"])[-1]
    mode = params.get("mode", ["abort"])[-1]
    if raw not in ("0", "1", "2"):
        raise bad_request(f"level must be 0, 1 or 2, got {raw!r}", "level")
    if mode not in _MODES:
        raise bad_request(f"mode must be one of {', '.join(_MODES)}, got {mode!r}", "mode")
    return int(raw)


def parse_tags(query: str) -> frozenset[SleepTag] | None:
    """The tags to wake; None: all of them."""
    raw = parse_qs(query).get("tags", [])
    known = {t.value for t in SleepTag}
    unknown = [t for t in raw if t not in known]
    if unknown:
        raise bad_request(f"unknown tag {unknown[0]!r}; known: {', '.join(sorted(known))}", "tags")
    return frozenset(SleepTag(t) for t in raw) or None


class SleepMode:
    """Whether the replica sleeps, and what putting it to sleep or waking it costs."""

    def __init__(self, times: SleepTimes, engine: RealtimeEngine) -> None:
        self._times = times
        self._engine = engine
        self._asleep: frozenset[SleepTag] = frozenset()
        self._slept_before = False
        self._awake = asyncio.Event()
        self._awake.set()
        # One transition at a time, as vLLM's engine core runs one utility call at a time.
        self._lock = asyncio.Lock()

    @property
    def is_sleeping(self) -> bool:
        return bool(self._asleep)

    async def wait_awake(self) -> None:
        """Returns at once while awake; else when woken (the paused scheduler's queue)."""
        await self._awake.wait()

    async def sleep(self, level: int) -> None:
        async with self._lock:
            self._awake.clear()  # from now on new requests wait
            # Polled: a sleep is rare, and an idle event would cost every request a check.
            while self._engine.in_flight:  # noqa: ASYNC110
                await asyncio.sleep(_IDLE_POLL_S)
            if level > 0:
                self._engine.drop_prefix_cache()
            await asyncio.sleep(sleep_duration_s(self._times, level, self._slept_before))
            self._slept_before = self._slept_before or level > 0
            self._asleep |= tags_put_to_sleep(level)

    async def wake_up(self, tags: frozenset[SleepTag] | None) -> None:
        async with self._lock:
            woken = self._asleep if tags is None else self._asleep & tags
            await asyncio.sleep(wake_duration_s(self._times, woken))
            self._asleep -= woken
            if not self._asleep:
                self._awake.set()
