"""The HTTP/1.1 client core against real loopback servers: each answer's framing (length,
chunked, until close, interim answers), streaming as it arrives, keep-alive, and every way
an exchange fails, as the project's own errors."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from servepilot.core.errors import EngineError
from servepilot.http1.client import MAX_HEAD_BYTES, ClientConnection, connect
from servepilot.http1.errors import MalformedAnswer, Unreachable, UpstreamFailed

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


class Pool:
    """The connections' owner: what went back, what was forgotten."""

    def __init__(self) -> None:
        self.kept: list[ClientConnection] = []
        self.forgotten: list[ClientConnection] = []

    def put_back(self, conn: ClientConnection) -> None:
        self.kept.append(conn)

    def forget(self, conn: ClientConnection) -> None:
        self.forgotten.append(conn)


class Recorder:
    """A sink that keeps everything it is told."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.reads: list[bytes] = []
        self.read_seen = asyncio.Event()
        self.body = b""
        self.failure: UpstreamFailed | None = None
        self.answered: bool | None = None
        self.done = asyncio.get_running_loop().create_future()

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status, self.headers = status, dict(headers)

    def on_read(self, data: bytes) -> None:
        self.reads.append(data)
        self.read_seen.set()

    def on_end(self, data: bytes) -> None:
        self.body = b"".join(self.reads) + data
        self.done.set_result(None)

    def on_failure(self, exc: UpstreamFailed, answered: bool) -> None:
        self.failure, self.answered = exc, answered
        self.done.set_result(None)


@contextlib.asynccontextmanager
async def server(*scripts: Script) -> AsyncIterator[int]:
    """A loopback server running `scripts` in turn, one per exchange of a connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for script in scripts:
                await reader.readuntil(b"\r\n\r\n")
                await script(reader, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()


def answer(raw: bytes, *, close: bool = False) -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        if close:
            await writer.drain()
            writer.close()
            await asyncio.sleep(3600)  # the connection's end is the answer's

    return script


async def exchange(pool: Pool, conn: ClientConnection) -> Recorder:
    sink = Recorder()
    conn.send(REQUEST, sink)
    await asyncio.wait_for(sink.done, 5)
    conn.finish()
    return sink


def run(scripts: list[Script], exchanges: int = 1) -> tuple[list[Recorder], Pool]:
    async def go() -> tuple[list[Recorder], Pool]:
        pool = Pool()
        async with server(*scripts) as port:
            conn = await connect("127.0.0.1", port, pool, 5)
            sinks = [await exchange(pool, conn) for _ in range(exchanges)]
            await asyncio.sleep(0.05)  # a close by the server reaches the connection
            conn.abort()
        return sinks, pool

    return asyncio.run(go())


LENGTH = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED_HEAD = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNKED = CHUNKED_HEAD + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"


def test_content_length_and_chunked_answers_on_one_kept_alive_connection() -> None:
    (first, second), pool = run([answer(LENGTH), answer(CHUNKED)], exchanges=2)
    assert (first.status, first.body, first.failure) == (200, b"hello", None)
    assert first.headers[b"content-type"] == b"text/plain"  # names lower-cased
    assert (second.status, second.body, second.failure) == (201, b"abcde", None)
    assert len(pool.kept) == 2 and pool.kept[0] is pool.kept[1]


def test_an_answer_split_anywhere_across_reads_is_the_same() -> None:
    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in range(len(CHUNKED)):
            writer.write(CHUNKED[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.001)

    (sink,), pool = run([dribble])
    assert (sink.status, sink.body) == (201, b"abcde")
    assert len(pool.kept) == 1


def test_a_body_until_close_ends_with_the_connection() -> None:
    (sink,), pool = run([answer(b"HTTP/1.1 200 OK\r\n\r\nto the end", close=True)])
    assert (sink.status, sink.body, sink.failure) == (200, b"to the end", None)
    assert pool.kept == [] and len(pool.forgotten) == 1


def test_an_interim_answer_is_skipped() -> None:
    (sink,), _ = run([answer(b"HTTP/1.1 100 Continue\r\n\r\n" + LENGTH)])
    assert (sink.status, sink.body) == (200, b"hello")


def test_a_stream_reaches_the_sink_as_it_arrives() -> None:
    """The server sends each chunk only after the sink was handed the previous one: an
    answer buffered until its end would never complete."""

    async def go() -> list[bytes]:
        sink_box: list[Recorder] = []

        async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for token in (b"one", b"two", b"three"):
                sink = sink_box[0]
                sink.read_seen.clear()
                writer.write(b"%x\r\n%s\r\n" % (len(token), token))
                await writer.drain()
                await asyncio.wait_for(sink.read_seen.wait(), 5)
            writer.write(b"0\r\n\r\n")

        pool = Pool()
        async with server(stream) as port:
            conn = await connect("127.0.0.1", port, pool, 5)
            sink = Recorder()
            sink_box.append(sink)
            conn.send(REQUEST, sink)
            await asyncio.wait_for(sink.done, 5)
            conn.abort()
        return [r for r in sink.reads if r]

    assert asyncio.run(go()) == [b"one", b"two", b"three"]


def test_a_peer_that_closes_mid_body_fails_the_exchange_after_its_head() -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
    (sink,), pool = run([answer(cut, close=True)])
    assert sink.status == 200 and sink.answered is True
    assert isinstance(sink.failure, UpstreamFailed) and isinstance(sink.failure, EngineError)
    assert "closed the connection" in str(sink.failure)
    assert pool.kept == []


def test_a_peer_that_closes_before_answering_fails_it_unanswered() -> None:
    (sink,), _ = run([answer(b"", close=True)])
    assert sink.answered is False and isinstance(sink.failure, UpstreamFailed)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "SSH-2.0"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "malformed"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD_BYTES, "larger than"),
    ],
    ids=["not http", "bad length", "endless head"],
)
def test_bytes_that_are_not_an_answer_are_malformed(raw: bytes, said: str) -> None:
    (sink,), pool = run([answer(raw)])
    assert isinstance(sink.failure, MalformedAnswer) and sink.answered is False
    assert said in str(sink.failure)
    assert pool.kept == []


def test_bytes_after_the_answer_close_the_connection() -> None:
    (sink,), pool = run([answer(LENGTH + b"HTTP/1.1 200 OK\r\n")])
    assert sink.body == b"hello"
    assert len(pool.forgotten) == 1 and not [c for c in pool.kept if not c.closed]


def test_connection_close_is_not_kept() -> None:
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    (sink,), pool = run([answer(raw)])
    assert sink.body == b"ok" and pool.kept == []


def test_a_refused_connection_is_unreachable() -> None:
    async def go() -> Unreachable:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        with pytest.raises(Unreachable) as caught:
            await connect("127.0.0.1", port, Pool(), 5)
        return caught.value

    refused = asyncio.run(go())
    assert not refused.timed_out and "cannot connect to 127.0.0.1" in str(refused)


def test_a_connection_not_opened_in_time_is_unreachable_timed_out() -> None:
    """A listener that accepts nothing and whose queue is full drops new connections' SYNs:
    the connect hangs until the timeout given."""

    async def go() -> tuple[Unreachable, float]:
        loop = asyncio.get_running_loop()
        with contextlib.ExitStack() as stack:
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(0)
            address = listener.getsockname()
            for _ in range(4):  # fill the accept queue (and the SYN queue's grace)
                filler = stack.enter_context(socket.socket())
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(address)
            await asyncio.sleep(0.05)
            started = loop.time()
            with pytest.raises(Unreachable) as caught:
                await connect(address[0], address[1], Pool(), 0.3)
            return caught.value, loop.time() - started

    timed_out, waited_s = asyncio.run(go())
    assert timed_out.timed_out and "within 0.3 s" in str(timed_out)
    assert 0.25 <= waited_s < 3
