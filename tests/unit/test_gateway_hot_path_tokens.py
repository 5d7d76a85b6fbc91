"""What the gateway does per token on its data path (issue 22: one upstream write per token,
its CPU per request at an everyday load must stay under vllm-router's).

Counted with fake transports, so the numbers are exact: per upstream read one client write
and one call into the relay, whatever the number of SSE events in it; a chunked stream goes
to the client as the replica framed it, whole wherever the reads are cut."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httptools

from servepilot.gateway.relay import Relay
from servepilot.http1.client import ClientConnection
from servepilot.http1.request import HttpRequest
from tests.support.stub_server import StubConfig, _Answer, answer_events
from tests.unit.gateway_support import PYTHON_FRAMES, run

CHUNKS = 16


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


@PYTHON_FRAMES
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
