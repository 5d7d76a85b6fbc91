"""The HTTP/1.1 server: listens, owns the connections, hands every complete request to one
handler coroutine, and stops in two steps (stop listening, then cut what is left).

Why not a web framework: the gateway is benchmarked for CPU time per proxied request against
a Rust router, and dozens of simulated replicas share a small machine with it. A framework's
request and response objects, middleware chain and writer layers cost more than the work
itself. This server parses with llhttp and lets the handler write the response straight to
the transport (see `request.HttpRequest`).

What differs between the servers that use it is passed in: the handler, the limits, and the
shape of the error bodies the server writes on its own (the gateway's OpenAI errors, vLLM's
for the simulated replica).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from servepilot.http1.connection import HttpConnection
from servepilot.http1.errors import Rejected
from servepilot.http1.request import HttpRequest

Handler = Callable[[HttpRequest], Awaitable[None]]
"""Answers one request (exactly once); a client that leaves cancels it."""

ErrorBody = Callable[[int, str, str], bytes]
"""(status, message, code) -> the JSON body of an error the server answers on its own: a
malformed request (400), a body or head over the limits (413, 431), a handler that failed or
did not answer (500)."""


@dataclass(frozen=True, slots=True)
class UploadLimit:
    """A path whose bodies may be larger than `Limits.max_body_bytes` (file uploads)."""

    path: str
    max_body_bytes: int
    setting: str
    """The configuration field that sets it, named in the 413."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int
    max_head_bytes: int = 64 * 1024
    """The request line and headers together (431 past it)."""
    uploads: tuple[UploadLimit, ...] = ()
    linger_s: float = 2.0
    """After an early answer (400, 413, 431): how long to go on reading what the client still
    sends before closing, so that it reads the answer rather than a reset."""
    linger_max_bytes: int = 64 * 1024 * 1024
    """...and how many bytes of it to read and discard at most."""

    def body_limit(self, path: bytes) -> tuple[int, str]:
        """The largest body accepted on `path`, and what to call that limit in a 413."""
        for upload in self.uploads:
            if path == upload.path.encode():
                return upload.max_body_bytes, f" ({upload.setting})"
        return self.max_body_bytes, ""


class HttpServer:
    """Listens and owns the connections; `handler` answers every complete request."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits,
        error_body: ErrorBody,
        on_rejected: Callable[[Rejected], None] | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.error_body = error_body
        self.connections: set[HttpConnection] = set()
        self.closing = False
        self.lingering = 0
        """Connections closing after an early answer (each ends within `Limits.linger_s`)."""
        self._on_rejected = on_rejected
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on `host`:`port` (0: any free port) and return the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self), host, port, backlog=4096, reuse_address=True
        )
        # Read untyped: uvloop's `sockets` is a list where typeshed says a tuple, which the
        # compiled module (core/accel.py) would check and refuse.
        server: Any = self._server
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    def stop_listening(self) -> None:
        """Refuse new connections; close idle keep-alive ones, and busy ones after their
        current response."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_idle()

    async def wait_idle(self) -> None:
        """Return once no request is being answered, pipelined ones included (after
        `stop_listening`: the drain of a server whose handlers end on their own)."""
        while tasks := {c.answering for c in self.connections if c.answering is not None}:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """Cut every connection left (after the drain) and release the socket."""
        self.stop_listening()
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def rejected(self, rejected: Rejected) -> None:
        """A request refused before any handler saw it (malformed, or over a limit)."""
        if self._on_rejected is not None:
            self._on_rejected(rejected)
