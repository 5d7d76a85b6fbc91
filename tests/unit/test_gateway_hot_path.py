"""What the gateway does per token and per request on its data path (issue 22: its CPU per
request at an everyday load, one upstream write per token, must stay under vllm-router's).

Counted with fake transports, so the numbers are exact: per upstream read one client write
and one call into the relay, whatever the number of SSE events in it; per request no timer
and no event-loop lookup of its own; the request timeout still fires on time."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sys
from typing import Any

import aiohttp
import httptools
import pytest

from servepilot.core import accel
from servepilot.gateway.deadlines import Deadlines
from servepilot.gateway.relay import Outcome, Relay
from servepilot.gateway.validation import InferenceRequest
from servepilot.http1.client import ClientConnection
from servepilot.http1.request import HttpRequest
from tests.support.stub_server import StubConfig, _Answer, answer_events
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import STREAM_CHAT, gateway_in_front_of, run

CHUNKS = 16
_PYTHON_FRAMES = pytest.mark.skipif(
    accel.compiled(accel.GATEWAY),
    reason="counts Python frames of the data path: compiled (make gateway-fast), it has none",
)


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def abort(self) -> None: ...


class _Conn:
    """The client side of an `HttpRequest` (an `HttpConnection`'s surface)."""

    closed = False
    paused = False

    def __init__(self) -> None:
        self.transport = _Transport()
        self.writable_callbacks: list[Any] = []

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def abort(self) -> None:
        self.closed = True


class _Pool:
    def put_back(self, conn: ClientConnection) -> None: ...

    def forget(self, conn: ClientConnection) -> None: ...


class _CountingRelay(Relay):
    __slots__ = ("reads",)

    def on_read(self, data: bytes) -> None:
        self.reads += 1
        super().on_read(data)


async def _relay(pieces: list[bytes]) -> tuple[_Conn, _CountingRelay]:
    up = ClientConnection(_Pool())  # type: ignore[arg-type]
    up.connection_made(_Transport())  # type: ignore[arg-type]
    client = _Conn()
    request = HttpRequest(client, "POST", b"/v1/chat/completions", {}, b"{}", True)  # type: ignore[arg-type]
    relay = _CountingRelay(
        request, up, (b"x-servepilot-replica", b"r0"), asyncio.get_running_loop()
    )
    relay.reads = 0
    up.send(b"POST / HTTP/1.1\r\n\r\n", relay)
    for piece in pieces:
        up.data_received(piece)
    await asyncio.wait_for(relay.done, 1)
    return client, relay


def test_a_token_per_upstream_read_is_one_client_write_and_one_relay_call() -> None:
    async def body() -> None:
        answer = _Answer("chat", StubConfig(chunks=CHUNKS))
        client, relay = await _relay([answer.first] + [answer.token] * CHUNKS + [answer.tail])
        # The head leaves with the role event; then one write per token; the tail, [DONE]
        # and the end of the body in one.
        assert len(client.transport.writes) == 1 + CHUNKS + 1
        assert relay.reads == 1 + CHUNKS  # the last read ends the answer: `on_end` instead
        outcome = relay.done.result()
        assert outcome.streamed and outcome.status == 200
        body = b"".join(client.transport.writes)
        assert body.count(b'"content":" tok"') == CHUNKS
        assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        assert outcome.streamed_bytes == sum(len(e) for e in _events(body))

    run(body())


def test_many_events_in_one_read_leave_in_one_write() -> None:
    async def body() -> None:
        answer = _Answer("chat", StubConfig(chunks=CHUNKS))
        client, _ = await _relay([answer.whole])
        assert len(client.transport.writes) == 1
        assert b"".join(client.transport.writes).count(b'"content":" tok"') == CHUNKS

    run(body())


def test_the_events_of_a_read_cost_no_python_call_each() -> None:
    """httptools calls back once per chunk (per token): that callback runs no Python frame,
    so a read of 16 events costs the same few Python calls as a read of one."""

    async def body() -> None:
        answer = _Answer("chat", StubConfig(chunks=CHUNKS))
        up = ClientConnection(_Pool())  # type: ignore[arg-type]
        up.connection_made(_Transport())  # type: ignore[arg-type]
        request = HttpRequest(_Conn(), "POST", b"/v1/chat/completions", {}, b"{}", True)  # type: ignore[arg-type]
        relay = Relay(request, up, (b"x-servepilot-replica", b"r0"), asyncio.get_running_loop())
        up.send(b"POST / HTTP/1.1\r\n\r\n", relay)
        up.data_received(answer.first)
        calls: list[str] = []

        def count(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls.append(frame.f_code.co_name)

        sys.setprofile(count)
        try:
            up.data_received(answer.token * CHUNKS)
        finally:
            sys.setprofile(None)
        assert len(calls) < 8, calls

    run(body())


def _events(chunked: bytes) -> list[bytes]:
    """The chunk payloads of a chunked body (after its head)."""
    rest = chunked[chunked.index(b"\r\n\r\n") + 4 :]
    out = []
    while rest:
        size_end = rest.index(b"\r\n")
        size = int(rest[:size_end], 16)
        if size == 0:
            break
        out.append(rest[size_end + 2 : size_end + 2 + size])
        rest = rest[size_end + 2 + size + 2 :]
    return out


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


@_PYTHON_FRAMES
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


# --- passthrough: a chunked stream goes to an HTTP/1.1 client as the replica framed it ------


def _start(client: _Conn) -> tuple[ClientConnection, Relay]:
    up = ClientConnection(_Pool())  # type: ignore[arg-type]
    up.connection_made(_Transport())  # type: ignore[arg-type]
    request = HttpRequest(client, "POST", b"/v1/chat/completions", {}, b"{}", True)  # type: ignore[arg-type]
    relay = Relay(request, up, (b"x-servepilot-replica", b"r0"), asyncio.get_running_loop())
    up.send(b"POST / HTTP/1.1\r\n\r\n", relay)
    return up, relay


class _Answers:
    """What a client parses out of the bytes it was sent: each answer's body."""

    def __init__(self, written: list[bytes]) -> None:
        self.bodies: list[bytes] = []
        self._parts: list[bytes] = []
        parser = httptools.HttpResponseParser(self)
        for data in written:
            parser.feed_data(data)

    def on_body(self, data: bytes) -> None:
        self._parts.append(data)

    def on_message_complete(self) -> None:
        self.bodies.append(b"".join(self._parts))


def test_a_chunked_stream_reaches_an_http11_client_framed_as_the_replica_framed_it() -> None:
    """Not re-framed: a read of several chunks stays several chunks, sizes as they were."""

    async def body() -> None:
        answer = _Answer("chat", StubConfig(chunks=2))
        token = answer.token.split(b"\r\n", 1)[1]
        upper = b"%X\r\n%b" % (len(token) - 2, token)  # the size in capitals, as HTTP allows
        assert upper != answer.token
        reads = [answer.first, answer.token * 2, upper, answer.tail]
        client = _Conn()
        up, relay = _start(client)
        for piece in reads:
            up.data_received(piece)
        outcome = await asyncio.wait_for(relay.done, 1)
        sent = b"".join(client.transport.writes)
        head_end = sent.index(b"\r\n\r\n") + 4
        assert sent[head_end:] == b"".join(reads)[len(_Answer.HEAD) :]
        events = answer_events("chat", StubConfig(chunks=2))  # the usage says 2: as sent
        unframed = b"".join((*events.first, *[events.token] * 3, *events.tail))
        assert _Answers(client.transport.writes).bodies == [unframed]
        assert outcome.streamed_bytes == len(unframed)
        assert b'"completion_tokens":2' in outcome.tail

    run(body())


@_PYTHON_FRAMES
def test_a_token_passed_through_costs_one_call_into_the_relay_and_no_other() -> None:
    async def body() -> None:
        answer = _Answer("chat", StubConfig(chunks=CHUNKS))
        client = _Conn()
        up, _ = _start(client)
        up.data_received(answer.first)
        calls: list[str] = []

        def count(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and "servepilot" in frame.f_code.co_filename:
                calls.append(frame.f_code.co_name)

        sys.setprofile(count)
        try:
            up.data_received(answer.token)
        finally:
            sys.setprofile(None)
        assert calls == ["data_received", "on_read"]
        assert client.transport.writes[-1] == answer.token

    run(body())


def test_a_stream_cut_anywhere_reaches_the_client_whole_and_ends_at_done() -> None:
    """Every place a read may end, the head and `[DONE]` included: the client parses the
    same events, its stream ends with `[DONE]`, before the replica's own end of the body."""

    async def body() -> None:
        answer = _Answer("chat", StubConfig(chunks=2))
        end = b"0\r\n\r\n"
        stream = answer.first + answer.token * 2 + answer.tail[: -len(end)]
        events = answer_events("chat", StubConfig(chunks=2))
        unframed = b"".join((*events.first, *[events.token] * 2, *events.tail))
        for cut in range(1, len(stream)):
            client = _Conn()
            up, relay = _start(client)
            up.data_received(stream[:cut])
            up.data_received(stream[cut:])
            assert relay.done.done(), cut
            up.data_received(end)
            outcome = relay.done.result()
            assert _Answers(client.transport.writes).bodies == [unframed], cut
            assert outcome.streamed_bytes == len(unframed), cut
            assert outcome.first_chunk_at is not None

    run(body())


def test_a_stream_passed_through_that_breaks_inside_a_chunk_cuts_its_client() -> None:
    """A replica gone after a read that ended inside a chunk: nothing written after that
    could be read as an end, so the client's connection is cut; gone after whole events,
    the client stays, for the proxy's error event."""

    async def body() -> None:
        answer = _Answer("chat", StubConfig(chunks=2))
        for cut, cuts_client in ((len(answer.token), False), (20, True)):
            client = _Conn()
            up, relay = _start(client)
            up.data_received(answer.first)
            up.data_received(answer.token[:cut])
            up.connection_lost(None)
            outcome = await asyncio.wait_for(relay.done, 1)
            assert outcome.failure is not None and outcome.streamed
            assert client.closed is cuts_client

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
