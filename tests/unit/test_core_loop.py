"""core.loop.cancel_and_wait: a task stopped without eating its caller's own cancellation."""

from __future__ import annotations

import asyncio

import pytest

from servepilot.core.loop import cancel_all_and_wait, cancel_and_wait


async def _slow_to_stop(stopped: list[str]) -> None:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)  # cleanup that takes a while, as a ticker's last line does
        stopped.append("child")
        raise


def test_the_task_ends_cancelled_and_the_caller_goes_on() -> None:
    async def run() -> list[str]:
        stopped: list[str] = []
        child = asyncio.create_task(_slow_to_stop(stopped))
        await asyncio.sleep(0)
        await cancel_and_wait(child)
        assert child.cancelled()
        return stopped

    assert asyncio.run(run()) == ["child"]


@pytest.mark.parametrize("children", [1, 3])
def test_a_caller_cancelled_while_it_waits_is_cancelled(children: int) -> None:
    # `with suppress(CancelledError): await child` returns normally here: a Ctrl-C landing
    # while bench waited for its progress ticker was lost, and the run went on.
    async def run() -> tuple[list[str], list[asyncio.Task[None]]]:
        stopped: list[str] = []
        tasks = [asyncio.create_task(_slow_to_stop(stopped)) for _ in range(children)]
        await asyncio.sleep(0)
        stop = cancel_and_wait(tasks[0]) if children == 1 else cancel_all_and_wait(tasks)
        caller = asyncio.create_task(stop)
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0.1)
        return stopped, tasks

    stopped, tasks = asyncio.run(run())
    # The caller's cancellation reaches the task it awaits too (asyncio passes it on), which
    # cuts that task's cleanup short: it ends, cancelled, either way. The others, already
    # cancelled and not awaited, finish their cleanups on their own.
    assert all(task.cancelled() for task in tasks) and stopped == ["child"] * (children - 1)


def test_a_task_already_done_is_left_as_it_was() -> None:
    async def run() -> asyncio.Task[int]:
        async def answer() -> int:
            return 42

        done = asyncio.create_task(answer())
        await done
        await cancel_and_wait(done)
        return done

    assert asyncio.run(run()).result() == 42


def test_all_are_cancelled_before_any_is_awaited() -> None:
    # So their cleanups overlap rather than run one after another; each still runs to its end.
    async def run() -> tuple[list[str], list[asyncio.Task[None]]]:
        stopped: list[str] = []
        children = [asyncio.create_task(_slow_to_stop(stopped)) for _ in range(2)]
        await asyncio.sleep(0)
        assert not any(child.cancelling() for child in children)
        waiter = asyncio.create_task(cancel_all_and_wait(children))
        await asyncio.sleep(0)
        # Both were told before the waiter awaited the first one's end.
        assert all(child.cancelling() for child in children)
        await waiter
        return stopped, children

    stopped, children = asyncio.run(run())
    assert stopped == ["child", "child"] and all(child.cancelled() for child in children)
