"""`up` holds its gateway's port from its first check until the gateway listens on it."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest
from aiohttp import web

from servepilot.core.errors import FleetError
from servepilot.fleet.serve import reserve_port
from tests.unit.fake_upstream import free_port


def _bind_plain(port: int) -> int:
    """0 when a socket without SO_REUSEADDR (another program's) can bind `port`, else errno."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno or -1
    return 0


def test_the_port_is_held_for_the_gateway_and_from_everyone_else() -> None:
    port = free_port()

    async def listen() -> None:
        app = web.Application()
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
        finally:
            await runner.cleanup()

    with reserve_port("127.0.0.1", port):
        assert _bind_plain(port) == errno.EADDRINUSE  # nobody else takes it meanwhile
        asyncio.run(listen())  # the gateway listens on it, as aiohttp binds
    assert _bind_plain(port) == 0  # given back


def test_a_taken_port_is_refused_at_once() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = pytest.raises(FleetError, match=f"port {port} on 127.0.0.1 is already in use")
        with refused, reserve_port("127.0.0.1", port):
            pass


def test_port_zero_reserves_nothing() -> None:
    with reserve_port("127.0.0.1", 0):
        pass
