"""What the gateway does per request on its data path (issue 22: its CPU per request at an
everyday load must stay under vllm-router's).

Per request no timer and no event-loop lookup of its own, six coroutines and no done callback;
the request timeout still fires on time; the records built per request set their fields with
plain stores."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sys
from typing import Any

import aiohttp
import pytest

from servepilot.gateway.deadlines import Deadlines
from servepilot.gateway.relay import Outcome
from servepilot.gateway.validation import InferenceRequest
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import PYTHON_FRAMES, STREAM_CHAT, gateway_in_front_of, run


def test_requests_arm_no_timer_and_look_up_no_loop_of_their_own() -> None:
    """20 streamed requests on one keep-alive connection: their timeouts share one timer,
    and the client connection looked its event loop up once, not once per request."""

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as resp:
                await resp.read()  # the connections exist, the timer is armed
            loop = asyncio.get_running_loop()
            timeouts, lookups = [], []
            real_call_at, real_call_later = loop.call_at, loop.call_later
            real_get_running_loop = asyncio.get_running_loop

            def call_at(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
                timeouts.append(getattr(callback, "__name__", ""))
                return real_call_at(when, callback, *args, **kw)

            def call_later(
                delay: float, callback: Any, *args: Any, **kw: Any
            ) -> asyncio.TimerHandle:
                timeouts.append(getattr(callback, "__name__", ""))
                return real_call_later(delay, callback, *args, **kw)

            def get_running_loop() -> asyncio.AbstractEventLoop:
                lookups.append(sys._getframe(1).f_code.co_filename)
                return real_get_running_loop()

            loop.call_at, loop.call_later = call_at, call_later  # type: ignore[method-assign]
            asyncio.get_running_loop = get_running_loop
            try:
                for _ in range(20):
                    async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as r:
                        assert r.status == 200
                        await r.read()
            finally:
                del loop.call_at, loop.call_later
                asyncio.get_running_loop = real_get_running_loop
            # A timer per request would be 20 `expire` timers.
            assert timeouts.count("expire") + timeouts.count("_fire") <= 1
            assert not [f for f in lookups if f.endswith("http1/connection.py")]

    run(body())


@PYTHON_FRAMES
def test_a_request_runs_six_coroutines_of_ours_and_no_done_callback() -> None:
    """Per streamed request on warm connections: the connection's handler, the gateway's,
    the proxy's two, admission and the attempt; routing and taking a warm upstream
    connection are plain calls, and what follows the answer runs in the handler's task
    rather than in a done callback of its own."""

    async def body() -> None:
        upstream = await FakeUpstream("a").start()
        async with gateway_in_front_of([upstream]) as (_, url), aiohttp.ClientSession() as client:
            for _ in range(2):  # the connections exist and are idle
                async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as r:
                    await r.read()
            coroutines: set[str] = set()
            done_callbacks: list[str] = []

            def profile(frame: Any, event: str, arg: Any) -> None:
                code = frame.f_code
                if "servepilot" not in code.co_filename:
                    return
                if event == "call" and code.co_flags & inspect.CO_COROUTINE:
                    coroutines.add(code.co_name)
                elif event == "c_call" and getattr(arg, "__name__", "") == "add_done_callback":
                    done_callbacks.append(code.co_name)

            sys.setprofile(profile)
            try:
                async with client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT) as r:
                    assert r.status == 200
                    await r.read()
            finally:
                sys.setprofile(None)
            assert coroutines == {"_handle", "handle", "forward", "_forward", "acquire", "_attempt"}
            assert done_callbacks == []

    run(body())


def test_deadlines_expire_on_time_in_start_order_and_never_an_ended_one() -> None:
    class Item:
        def __init__(self, name: str) -> None:
            self.name = name

        def expire(self) -> None:
            expired.append((self.name, loop.time() - started))

    expired: list[tuple[str, float]] = []

    async def body() -> None:
        nonlocal loop, started
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadlines = Deadlines(0.1)
        a, b, c = Item("a"), Item("b"), Item("c")
        deadlines.add(a, loop)
        deadlines.add(b, loop)
        deadlines.discard(a)  # a ended: its deadline passes without it
        await asyncio.sleep(0.05)
        deadlines.add(c, loop)  # due at 0.15
        await asyncio.sleep(0.2)
        assert [name for name, _ in expired] == ["b", "c"]
        assert 0.09 <= expired[0][1] < 0.14
        assert 0.14 <= expired[1][1] < 0.19
        assert len(deadlines) == 0

    loop: asyncio.AbstractEventLoop
    started = 0.0
    run(body())


def test_an_outcome_gets_the_fields_defaults() -> None:
    """One `Outcome` per request: its written-out __init__ gives every field its declared
    default."""
    built = Outcome(502, False)
    for field in dataclasses.fields(Outcome):
        if field.default is not dataclasses.MISSING:
            assert getattr(built, field.name) == field.default, field.name
    assert (built.status, built.streamed) == (502, False)
    given = dict(body=b"x", content_type=b"t", failure=None, retryable=True, timed_out=True,
                 ttfb_s=0.5, first_chunk_at=1.5, streamed_bytes=7, tail=b"y")  # fmt: skip
    assert dataclasses.asdict(Outcome(200, True, **given)) == {
        "status": 200,
        "streamed": True,
        **given,
    }


@pytest.mark.parametrize("record", [Outcome, InferenceRequest])
def test_a_record_built_per_request_sets_its_fields_with_plain_stores(record: type) -> None:
    """A frozen dataclass's __init__ sets each field through object.__setattr__ (and,
    compiled, stays interpreted): about 17,000 instructions for an `Outcome`."""
    code = getattr(record.__init__, "__code__", None)  # None: compiled, natively
    assert code is None or not {"__setattr__", "__dataclass_builtins_object__"} & set(code.co_names)
