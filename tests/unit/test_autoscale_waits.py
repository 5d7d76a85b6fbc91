"""The waits for added replicas: each leaves the books when it ends, is cancelled, or the
backend closes; a cancelled wait's coroutine sees the cancellation."""

from __future__ import annotations

import asyncio

from servepilot.fleet.autoscale.waits import StartWaits


def test_every_wait_leaves_the_books_by_its_own_path() -> None:
    seen: list[str] = []

    async def wait(name: str, gate: asyncio.Event) -> None:
        try:
            await gate.wait()
            seen.append(f"{name} ready")
        except asyncio.CancelledError:
            seen.append(f"{name} cancelled")
            raise

    async def run() -> None:
        waits = StartWaits()
        gates = {name: asyncio.Event() for name in ("r1", "r2", "r3", "r4")}
        for name, gate in gates.items():
            waits.start(name, wait(name, gate))
        assert waits.ids() == ("r1", "r2", "r3", "r4")
        gates["r1"].set()  # it gets ready: gone once its task ends
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert waits.ids() == ("r2", "r3", "r4")
        await waits.cancel("r2")  # removed while starting
        assert waits.ids() == ("r3", "r4")
        await waits.cancel("r2")  # twice is harmless
        await waits.cancel_all()  # the controller stops
        assert waits.ids() == ()

    asyncio.run(run())
    assert seen == ["r1 ready", "r2 cancelled", "r3 cancelled", "r4 cancelled"]


def test_a_replica_started_again_under_its_id_is_not_dropped_by_the_old_wait() -> None:
    async def until(gate: asyncio.Event) -> None:
        await gate.wait()

    async def run() -> None:
        waits = StartWaits()
        first = asyncio.Event()
        waits.start("r1", until(first))
        waits.discard("r1")
        waits.start("r1", until(asyncio.Event()))
        first.set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert waits.ids() == ("r1",)  # the new wait stays
        await waits.cancel_all()

    asyncio.run(run())


def test_a_controller_cancelled_while_a_wait_winds_down_is_cancelled() -> None:
    # A wait whose cleanup takes a moment (a launch being rolled back); the task cancelling it
    # is itself cancelled meanwhile (the controller stopping). The controller must not go on
    # as if nothing had happened, which is what suppressing CancelledError around the await did.
    after: list[str] = []

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            raise

    async def remove(waits: StartWaits) -> None:
        await waits.cancel("r1")
        after.append("went on")

    async def run() -> None:
        waits = StartWaits()
        waits.start("r1", slow_to_stop())
        await asyncio.sleep(0)
        remover = asyncio.create_task(remove(waits))
        await asyncio.sleep(0.01)
        remover.cancel()
        await asyncio.gather(remover, return_exceptions=True)
        assert remover.cancelled()

    asyncio.run(run())
    assert after == []
