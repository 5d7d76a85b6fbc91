"""The event loop servepilot's long-running commands run on: uvloop when it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
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
    """asyncio.run on uvloop (it roughly halves the gateway's CPU per proxied request)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
