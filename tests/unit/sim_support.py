"""The simulated replica on its own event loop in a thread of the test process, for tests that
talk to it over real sockets (test_sim_server, test_http1)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from servepilot.engine.simserver.config import SimSetup, build_setup, parse_args
from servepilot.engine.simserver.kvpublisher import KvEventPublisher
from servepilot.engine.simserver.realtime import RealtimeEngine
from servepilot.engine.simserver.server import sim_app
from servepilot.engine.simserver.tokens import load_tokenizer
from servepilot.http1 import HttpServer

T = TypeVar("T")

# A cost model with every term, in round numbers (seconds).
COST_FLAGS = [
    "--cost", "base_s=0.02", "--cost", "per_prefill_token_s=0.0001",
    "--cost", "per_prefill_seq_s=0.001", "--cost", "per_decode_seq_s=0.0005",
    "--cost", "per_context_token_s=0.000001",
]  # fmt: skip
BASE_ARGS = ["--model", "smollm2", "--dtype", "float32", "--max-model-len", "2048",
             "--kv-cache-memory-bytes", str(2 * 2**30)]  # fmt: skip


class ThreadedSim:
    """The simulated replica on its own event loop in a daemon thread, built as its process
    builds it (with its KV event publisher, given --kv-events-config)."""

    def __init__(self, argv: list[str]) -> None:
        self.args, _ = parse_args(argv)
        self.setup: SimSetup = build_setup(self.args)
        self.tokenizer = load_tokenizer(self.args.tokenizer)
        self.url = ""
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.engine: RealtimeEngine | None = None
        self.publisher: KvEventPublisher | None = None
        self._server: HttpServer | None = None

    def __enter__(self) -> ThreadedSim:
        self._thread.start()

        async def start() -> int:
            events = self.setup.kv_events
            self.publisher = KvEventPublisher.start(events) if events.publishes else None
            app = sim_app(self.setup, self.args, self.tokenizer, self.publisher)
            self.engine = app.engine
            self._server = app.http_server()
            self.engine.start()
            return await self._server.start("127.0.0.1", 0)

        self.port = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def inspect(self, read: Callable[[HttpServer], T]) -> T:
        """`read(server)`, run on the server's own loop (its state is not thread-safe)."""

        async def run() -> T:
            assert self._server is not None
            return read(self._server)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def idle_within(self, timeout_s: float) -> bool:
        """Whether the server answers every request it holds within `timeout_s`."""

        async def run() -> bool:
            assert self._server is not None
            try:
                await asyncio.wait_for(self._server.wait_idle(), timeout_s)
            except TimeoutError:
                return False
            return True

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s + 10)

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None and self.engine is not None
            await self._server.close()
            await self.engine.close()
            if self.publisher is not None:
                await self.publisher.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def chat_body(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A chat request for the simulated replica of the embedded model."""
    return {"model": "smollm2", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, **extra}  # fmt: skip
