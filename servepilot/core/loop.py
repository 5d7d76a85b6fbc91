"""The event loop servepilot's long-running commands run on: uvloop when it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop.

    The result is handed out through a list rather than as the task's result: when the runner
    closes it formats the main task's repr, which for a bench run's records costs seconds.
    """
    box: list[T] = []

    async def keep() -> None:
        box.append(await main)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(keep())
    return box[0]


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended, without swallowing a cancellation of the
    caller itself: `with suppress(CancelledError): await task` would also eat the caller's
    own CancelledError (a Ctrl-C that lands while it waits), and the caller would go on as if
    nothing had happened."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def cancel_all_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """`cancel_and_wait` for several tasks: all are cancelled first, so their cleanups overlap
    instead of running one after another."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        await cancel_and_wait(task)
