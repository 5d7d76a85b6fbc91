"""The gateway in the test process, serving from its own event loop in a daemon thread, for
tests that need `pool.add(..., capacity=N)`, synchronous (blocking) clients, or to read the
gateway's state between requests (`inspect`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from servepilot.core.config import GatewayConfig
from servepilot.gateway import Gateway

T = TypeVar("T")


@dataclass(frozen=True)
class Upstream:
    replica_id: str
    url: str
    capacity: int | None = None


class ThreadedGateway:
    """A `Gateway` serving from a daemon thread's event loop (uvloop when installed, as the
    CLI runs it); `run` and `inspect` reach into that loop from the caller's thread."""

    def __init__(self, config: GatewayConfig, upstreams: Iterable[Upstream]) -> None:
        self.config = config
        self.upstreams = list(upstreams)
        self.url = ""
        self.port = 0
        self._gateway: Gateway | None = None
        self._loop = new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def gateway(self) -> Gateway:
        assert self._gateway is not None
        return self._gateway

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def inspect(self, read: Callable[[Gateway], T]) -> T:
        """`read(gateway)` evaluated on the gateway's own loop (no torn reads)."""

        async def call() -> T:
            return read(self.gateway)

        return self.run(call())

    def __enter__(self) -> ThreadedGateway:
        self._thread.start()

        async def start() -> int:
            self._gateway = Gateway(self.config, seed=0)
            for up in self.upstreams:
                await self._gateway.pool.add(up.replica_id, up.url, capacity=up.capacity)
            return await self._gateway.start("127.0.0.1", 0)

        try:
            self.port = self.run(start())
        except BaseException:
            self.__exit__()
            raise
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._gateway is not None:
            with contextlib.suppress(Exception):
                self.run(self._gateway.stop(drain_timeout_s=2.0))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
