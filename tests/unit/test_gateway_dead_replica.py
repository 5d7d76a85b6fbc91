"""A gateway whose only replica is dead answers 503 at once and says why in its log.

A replica that never came up counts as starting (requests wait for it) only for
`cold_start_wait_s` after it was added: a loading vLLM refuses connections just as a dead one
does, so only time tells them apart. Past that window, requests, the waiting ones included,
get their 503 at once.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import aiohttp
import pytest

from servepilot.core.config import GatewayConfig
from servepilot.fleet.local import LocalBackend
from servepilot.fleet.membership import following
from servepilot.fleet.up import UpReporter, lost_warning
from servepilot.gateway import serve
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
        dead = FakeUpstream("a", starting=True)  # never listens: connections are refused
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


def test_gateway_replica_at_a_closed_port_is_down_at_once_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`servepilot gateway --replica URL` hands over a running replica: dead at its first
    check means down, and a request gets its 503 at once, not after cold_start_wait_s."""

    async def body() -> None:
        dead = FakeUpstream("dead")  # never listens
        config = GatewayConfig(port=0, retry_after_s=3, admission={"cold_start_wait_s": 60.0})
        stop = asyncio.Event()
        ports: list[int] = []
        with caplog.at_level(logging.INFO, logger="servepilot.gateway"):
            serving = asyncio.ensure_future(
                serve(config, [("r0", dead.url)], stop=stop, on_started=ports.append)
            )
            await eventually(until(lambda: bool(ports)))
            async with aiohttp.ClientSession() as client:
                assert await _timed_503(client, f"http://127.0.0.1:{ports[0]}") < 5.0
            stop.set()
            await serving
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            f"replica r0 ({dead.url}) is down: it was added as running and its first check "
            "failed: GET /health: cannot connect (Connection refused)"
        ]

    run(body())


def test_admin_add_is_running_unless_it_says_starting() -> None:
    async def body() -> None:
        async with (
            gateway_in_front_of([], retry_after_s=3, admission={"cold_start_wait_s": 60.0}) as (
                gw,
                url,
            ),
            aiohttp.ClientSession() as client,
        ):
            running = {"id": "a", "url": FakeUpstream("a").url}
            async with client.post(f"{url}/admin/replicas", json=running) as resp:
                assert resp.status == 201
            assert not gw.pool.starting()
            assert await _timed_503(client, url) < 0.5
            loading = {"id": "b", "url": FakeUpstream("b").url, "starting": True}
            async with client.post(f"{url}/admin/replicas", json=loading) as resp:
                assert resp.status == 201
            assert gw.pool.starting()
            bad = {"url": FakeUpstream("c").url, "starting": "yes"}
            async with client.post(f"{url}/admin/replicas", json=bad) as resp:
                assert (await error_of(resp, 400))["message"].startswith("`starting` must be")

    run(body())


def test_a_replica_whose_process_exited_is_down_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The local backend's watch tells the gateway when a replica's process exits (and `up`
    warns): no health check rounds to wait for, no cold-start wait for one still loading."""

    warned: list[str] = []

    async def body() -> None:
        replica = await FakeUpstream("a").start()
        loading = FakeUpstream("b", starting=True)
        with caplog.at_level(logging.WARNING, logger="servepilot.gateway.pool"):
            async with (
                gateway_in_front_of(
                    [replica, loading], retry_after_s=3, health_interval_s=60.0
                ) as (gw, url),
                aiohttp.ClientSession() as client,
            ):
                assert gw.pool.get("a").healthy and gw.pool.starting()
                exited = _Exited({"a": 1, "b": -9})
                backend = LocalBackend(exited, lambda info: None, poll_s=0.05)  # type: ignore[arg-type]
                async with following(backend, gw.membership, lost_warning(_telling(warned))):
                    # The watch reports the two exits one after the other: wait for both.
                    await eventually(
                        until(lambda: not gw.pool.get("a").healthy and not gw.pool.starting()),
                        timeout_s=0.5,
                    )
                    assert await _timed_503(client, url) < 0.5
        assert warned == [
            "replica a lost: its process exited with code 1; the gateway routes around it "
            "(log: a.log)",
            "replica b lost: its process exited with code -9; the gateway routes around it "
            "(log: b.log)",
        ]
        assert caplog.messages == [
            f"replica a ({replica.url}) is down, taken out of rotation: its process exited "
            "with code 1",
            f"replica b ({loading.url}) is down, taken out of rotation: its process exited "
            "with code -9",
        ]

    run(body())


class _Exited:
    """Stands in for `LocalReplicas`: these replicas' processes have exited."""

    def __init__(self, codes: dict[str, int]) -> None:
        self._codes = codes
        self.processes: list[SimpleNamespace] = []

    def exited(self) -> list[tuple[SimpleNamespace, int]]:
        return [
            (SimpleNamespace(replica_id=rid, log_path=f"{rid}.log"), code)
            for rid, code in self._codes.items()
        ]


def _telling(warned: list[str]) -> UpReporter:
    """A reporter whose warnings land in `warned`, without the time stamp."""
    return UpReporter(lambda _: None, lambda _: None, lambda line: warned.append(line[9:]))
