"""The gateway's keep-alive connections to one replica: its pooling policy over the HTTP/1.1
client core (`servepilot.http1.client`), which does the wire.

Idle connections are reused newest first (their socket buffers are warm) while younger than
`KEEPALIVE_S`; a request on a warm pool awaits nothing to get its connection.
"""

from __future__ import annotations

import collections
import contextlib
import time

from servepilot.http1.client import ClientConnection, connect

# uvicorn (which serves vLLM) closes idle connections after 5 s; dropping ours first avoids
# reusing a connection the replica is closing at that moment, which a POST cannot survive.
KEEPALIVE_S = 4.0


class HostPool:
    """Idle keep-alive connections to one replica, newest last."""

    def __init__(self, host: str, port: int, connect_timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self._idle: collections.deque[ClientConnection] = collections.deque()
        self.open = 0

    def reuse(self) -> ClientConnection | None:
        """The newest idle keep-alive connection still fresh enough to reuse, if any: a
        plain call, so that a request on a warm pool awaits nothing to get its connection."""
        idle = self._idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.abort()
        return None

    async def connect(self) -> ClientConnection:
        """A new connection (`Unreachable` when the replica cannot be reached in time)."""
        conn = await connect(self.host, self.port, self, self.connect_timeout_s)
        self.open += 1
        return conn

    def put_back(self, conn: ClientConnection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def forget(self, conn: ClientConnection) -> None:
        self.open -= 1
        with contextlib.suppress(ValueError):  # it was busy, not idle
            self._idle.remove(conn)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()
