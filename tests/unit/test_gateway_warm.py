"""The gateway's warm pool (gateway/warm.py) against real simulated replicas: a sleep waits for
the replica's requests in flight, each state changes on the replica's word only, and a replica
that cannot sleep is left serving with the reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from servepilot.core.config import GatewayConfig
from servepilot.core.errors import EngineError
from servepilot.gateway import Gateway
from servepilot.gateway.replica import ReplicaInfo, SleepState
from servepilot.gateway.warm import SleepConflict
from tests.unit.sim_support import BASE_ARGS, ThreadedSim

SLEEPY = [*BASE_ARGS, "--step-ms", "2", "--enable-sleep-mode", "--first-sleep-s", "0.2",
          "--sleep-s", "0.05", "--wake-s", "0.1"]  # fmt: skip


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[ThreadedSim, ThreadedSim]]:
    with ThreadedSim(SLEEPY) as sleepy, ThreadedSim([*BASE_ARGS, "--step-ms", "2"]) as plain:
        yield sleepy, plain


def _routable(gateway: Gateway) -> list[str]:
    return sorted(v.replica_id for v in gateway.pool.snapshot())


@contextlib.asynccontextmanager
async def _gateway(sleepy_url: str, plain_url: str) -> AsyncIterator[Gateway]:
    """A gateway in front of `a` (with sleep mode) and `b` (without)."""
    gateway = Gateway(GatewayConfig(port=0))
    await gateway.pool.add("a", sleepy_url)
    await gateway.pool.add("b", plain_url)
    try:
        yield gateway
    finally:
        await gateway.pool.close()


async def _scenario(sleepy_url: str, plain_url: str) -> None:
    heard: list[ReplicaInfo] = []
    async with _gateway(sleepy_url, plain_url) as gateway:
        gateway.warm.on_change(heard.append)
        # A request in flight on `a`: the sleep takes it out of rotation at once, then waits.
        held = gateway.pool.acquire("a")
        sleeping = asyncio.create_task(gateway.warm.sleep("a", 1, drain_timeout_s=10))
        await asyncio.sleep(0.2)
        assert gateway.pool.get("a").sleep is SleepState.FALLING_ASLEEP
        assert _routable(gateway) == ["b"]
        assert not sleeping.done()
        gateway.pool.release(held)
        slept = await sleeping
        assert (slept.sleep, slept.drained) == (SleepState.ASLEEP, True)
        assert slept.took_s >= 0.2  # the replica's first sleep
        assert _routable(gateway) == ["b"] and gateway.pool.ready()
        await gateway.pool.check_all()  # its /health is 200: still asleep, not down
        assert gateway.pool.get("a").healthy and gateway.pool.get("a").sleep is SleepState.ASLEEP

        with pytest.raises(SleepConflict, match="the last replica serving"):
            await gateway.warm.sleep("b", 1, drain_timeout_s=1)
        woken = await gateway.warm.wake("a")
        assert woken.sleep is SleepState.AWAKE and woken.took_s >= 0.1
        assert _routable(gateway) == ["a", "b"]

        # `b` runs without sleep mode: refused, and it keeps serving.
        with pytest.raises(EngineError, match=r"/sleep\?level=1 answered HTTP 404") as failed:
            await gateway.warm.sleep("b", 1, drain_timeout_s=1)
        assert failed.value.hint is not None and "engine.sleep_mode" in failed.value.hint
        assert gateway.pool.get("b").sleep is SleepState.AWAKE
        assert _routable(gateway) == ["a", "b"]
        # Each change told once; the failed sleep of `b` too, as `b` says it is: awake.
        assert [(i.replica_id, i.sleep) for i in heard] == [
            ("a", SleepState.ASLEEP),
            ("a", SleepState.AWAKE),
            ("b", SleepState.AWAKE),
        ]


def test_sleep_drains_waits_for_the_replica_and_a_failure_leaves_it_serving(
    replicas: tuple[ThreadedSim, ThreadedSim],
) -> None:
    sleepy, plain = replicas
    asyncio.run(asyncio.wait_for(_scenario(sleepy.url, plain.url), 30))


async def _parking(sleepy_url: str, plain_url: str) -> None:
    async with _gateway(sleepy_url, plain_url) as gateway:
        gateway.warm.parks = True
        # `b` has no sleep mode: parked all the same, after its request in flight finished.
        held = gateway.pool.acquire("b")
        parking = asyncio.create_task(gateway.warm.sleep("b", 1, drain_timeout_s=10))
        await asyncio.sleep(0.1)
        assert gateway.pool.get("b").sleep is SleepState.FALLING_ASLEEP and not parking.done()
        gateway.pool.release(held)
        parked = await parking
        assert (parked.sleep, parked.drained, parked.took_s) == (SleepState.PARKED, True, 0.0)
        assert _routable(gateway) == ["a"] and gateway.pool.get("b").sleep.held
        await gateway.pool.check_all()  # parked, still healthy: not down
        assert gateway.pool.get("b").healthy
        woken = await gateway.warm.wake("b")
        assert (woken.sleep, woken.took_s) == (SleepState.AWAKE, 0.0)
        assert _routable(gateway) == ["a", "b"]


def test_a_pool_without_sleep_mode_parks_and_unparks_at_once(
    replicas: tuple[ThreadedSim, ThreadedSim],
) -> None:
    sleepy, plain = replicas
    asyncio.run(asyncio.wait_for(_parking(sleepy.url, plain.url), 30))
