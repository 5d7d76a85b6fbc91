"""A gateway whose only replica is dead answers 503 at once and says why in its log.

A replica that never came up counts as starting (requests wait for it) only for
`cold_start_wait_s` after it was added: a loading vLLM refuses connections just as a dead one
does, so only time tells them apart. Past that window, requests, the waiting ones included,
get their 503 at once.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import CHAT, error_of, eventually, gateway_in_front_of, run, until

WINDOW_S = 1.0


async def _timed_503(client: aiohttp.ClientSession, url: str) -> float:
    """Seconds a chat request took to get its 503 (checked, with Retry-After)."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    async with client.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
        assert (await error_of(resp, 503))["code"] == "no_ready_replica"
        assert resp.headers["Retry-After"] == "3"
    return loop.time() - sent


def test_a_replica_that_never_comes_up_gets_503s_at_once_after_its_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        dead = FakeUpstream("a")  # never listens: connections are refused
        cold = {"cold_start_wait_s": WINDOW_S}
        with caplog.at_level(logging.WARNING, logger="servepilot.gateway.pool"):
            async with (
                gateway_in_front_of([dead], retry_after_s=3, admission=cold) as (gw, url),
                aiohttp.ClientSession() as client,
            ):
                added = asyncio.get_running_loop().time()
                await asyncio.sleep(WINDOW_S / 2)
                # Sent inside the window: it waits, but only until the window closes, not for
                # a whole cold_start_wait_s of its own.
                waited_s = await _timed_503(client, url)
                assert WINDOW_S / 2 - 0.2 < waited_s < WINDOW_S - 0.2
                assert asyncio.get_running_loop().time() - added < WINDOW_S + 0.3
                # Past the window, nothing is starting: at once.
                assert not gw.pool.starting()
                assert await _timed_503(client, url) < 0.2
                await eventually(until(lambda: bool(caplog.records)))
        [line] = caplog.messages
        assert line == (
            f"replica a ({dead.url}) is down: not healthy once in the 1 s since it was added "
            "(cold_start_wait_s); the last check: GET /health: cannot connect "
            "(Connection refused)"
        )
        assert caplog.records[0].levelno == logging.WARNING

    run(body())


def test_a_replica_that_dies_is_logged_once_with_how_it_was_found(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        replica = await FakeUpstream("a").start()
        with caplog.at_level(logging.WARNING, logger="servepilot.gateway.pool"):
            async with (
                gateway_in_front_of([replica], retry_after_s=3) as (gw, url),
                aiohttp.ClientSession() as client,
            ):
                await replica.stop()
                await eventually(until(lambda: not gw.pool.get("a").healthy))
                assert await _timed_503(client, url) < 0.2
                await asyncio.sleep(0.2)  # more failed checks: no more lines
        [line] = caplog.messages
        assert line == (
            f"replica a ({replica.url}) is down, taken out of rotation: 2 failures in a row, "
            "the last: GET /health: cannot connect (Connection refused)"
        )

    run(body())
