"""The request sender: timestamps, what counts as content, and every way a server can fail."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from servepilot.bench.client import Client, Target, send_one
from servepilot.bench.records import Endpoint, RequestRecord, RequestSpec
from servepilot.core import loop
from servepilot.core.errors import ConfigError
from tests.support.stub_server import StubConfig, threaded_stub

SPEC = RequestSpec(index=7, prompt="hello", max_tokens=5, input_tokens=1)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return loop.run(coro)


# -- against the stub -------------------------------------------------------------------


def test_chunk_times_follow_the_server() -> None:
    with threaded_stub(StubConfig(chunks=5, chunk_delay_s=0.02)) as stub:
        record = run(send_one(Target(stub.url, "stub-model"), SPEC))
    assert record.ok, record.error_detail
    assert len(record.chunk_s) == 5  # the role chunk, finish chunk and usage chunk are not content
    assert record.sent_s == record.intended_s
    # The stub waits 20 ms before each token, so token i cannot arrive before 20 ms * (i + 1).
    # Gaps between tokens are not checked: a token read late under load shortens the next gap.
    since_sent = [t - record.sent_s for t in record.chunk_s]
    assert all(s >= 0.019 * (i + 1) for i, s in enumerate(since_sent)), since_sent
    assert since_sent == sorted(since_sent)
    assert record.end_s == record.chunk_s[-1]
    assert (record.input_tokens, record.output_tokens) == (32, 5)
    assert record.replica == "stub-0" and record.index == 7


@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.COMPLETIONS])
def test_one_read_answers_count_every_token(endpoint: Endpoint) -> None:
    with threaded_stub(StubConfig(chunks=16)) as stub:
        record = run(send_one(Target(stub.url, "stub-model", endpoint=endpoint), SPEC))
    assert record.ok and len(record.chunk_s) == 16 and record.output_tokens == 16


def test_keeps_connections_alive() -> None:
    async def go(url: str) -> tuple[list[RequestRecord], int]:
        client = Client(Target(url, "stub-model"))
        records = [await client.send(SPEC) for _ in range(10)]
        opened = len(client._pool.open)
        await client.aclose()
        return records, opened

    with threaded_stub(StubConfig(chunks=3)) as stub:
        records, opened = run(go(stub.url))
    assert all(r.ok for r in records) and opened == 1


def test_target_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="http"):
        Target("localhost:8000", "m")
    with pytest.raises(ConfigError, match="timeout"):
        Target("http://h", "m", timeout_s=0)
    with pytest.raises(ConfigError, match="line break"):
        Target("http://h", "m", headers=(("X-A", "1\r\nX-B: 2"),))
    assert Target("http://h:1/v1", "m").path == "/v1/chat/completions"
    assert Target("http://h:1", "m", endpoint=Endpoint.COMPLETIONS).path == "/v1/completions"


# -- a scriptable raw server: it answers each request with the bytes a test gives it ---------

Reply = Callable[[bytes, asyncio.Transport], Awaitable[None]]


class RawServer:
    """Answers each request (read up to the end of its body) with `reply`."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.requests: list[bytes] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.get_running_loop().create_server(
            lambda: _RawProtocol(self), "127.0.0.1", 0
        )
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


class _RawProtocol(asyncio.Protocol):
    def __init__(self, owner: RawServer) -> None:
        self.owner, self.buf = owner, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15 :].split(b"\r\n")[0]) if at >= 0 else 0
        if len(self.buf) >= end + 4 + length:
            request, self.buf = self.buf[: end + 4 + length], self.buf[end + 4 + length :]
            self.owner.requests.append(request)
            task = asyncio.ensure_future(self.owner.reply(request, self.transport))  # type: ignore[arg-type]
            task.add_done_callback(lambda t: t.result())


def sse(*events: bytes, head: bytes = b"", close: bool = False) -> Reply:
    """A reply streaming `events` (payloads of `data:` lines) in chunked encoding."""

    async def reply(request: bytes, transport: asyncio.Transport) -> None:
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n" + head + b"\r\n"
        )
        for event in events:
            body = event if event.startswith((b"data", b":", b"event")) else b"data: " + event
            body += b"\n\n"
            transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        if close:
            transport.close()
        else:
            transport.write(b"0\r\n\r\n")

    return reply


def plain(status: int, body: bytes, ctype: bytes = b"application/json") -> Reply:
    async def reply(request: bytes, transport: asyncio.Transport) -> None:
        transport.write(
            b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status, ctype, len(body), body)
        )

    return reply


def chat(text: str) -> bytes:
    """A content chunk, compact like vLLM's."""
    delta = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return json.dumps(delta, separators=(",", ":")).encode()


ROLE = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
USAGE = b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'


def against(reply: Reply, target: dict[str, Any] | None = None) -> RequestRecord:
    async def go() -> RequestRecord:
        async with RawServer(reply) as url:
            return await send_one(Target(url, "m", **(target or {})), SPEC)

    record: RequestRecord = run(go())
    return record


# -- every kind of bad server becomes a failed record ------------------------------------


async def _never(request: bytes, transport: asyncio.Transport) -> None:
    await asyncio.sleep(30)


async def _hang_up(request: bytes, transport: asyncio.Transport) -> None:
    transport.close()


async def _gibberish(request: bytes, transport: asyncio.Transport) -> None:
    transport.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


BAD_SERVERS: list[tuple[str, Reply, str, str]] = [
    ("html page", plain(200, b"<html>hi</html>", b"text/html"), "not_openai", "<html>"),
    ("json, no choices", plain(200, b'{"hello": 1}'), "not_openai", "hello"),
    ("not streamed", plain(200, b'{"choices": [{"message": {}}]}'), "not_streamed", "JSON"),
    (
        "503",
        plain(503, b'{"error": {"message": "overloaded", "code": 503}}'),
        "http_503",
        "overloaded",
    ),
    ("404 html", plain(404, b"<h1>Not Found</h1>", b"text/html"), "http_404", "Not Found"),
    ("stream cut", sse(ROLE, chat("a"), chat("b"), close=True), "stream_interrupted", "closed"),
    ("event not json", sse(ROLE, b"not json"), "malformed_sse", "not json"),
    ("truncated event", sse(ROLE, b'{"choices":[{"delta":{"content":"x'), "malformed_sse", ""),
    ("event without choices", sse(b'{"foo": 1}'), "not_openai", "foo"),
    (
        "error event",
        sse(chat("a"), b'{"error": {"message": "engine died"}}'),
        "stream_error",
        "engine died",
    ),
    ("no content", sse(ROLE, USAGE, b"[DONE]"), "no_content", "none with content"),
    ("hang up", _hang_up, "connection_closed", ""),
    ("not http", _gibberish, "malformed_http", "SSH"),
]


@pytest.mark.parametrize(
    ("reply", "reason", "detail"),
    [case[1:] for case in BAD_SERVERS],
    ids=[case[0] for case in BAD_SERVERS],
)
def test_bad_server_gives_a_reason(reply: Reply, reason: str, detail: str) -> None:
    record = against(reply)
    assert record.error == reason, record.error_detail
    assert detail in record.error_detail
    assert not record.ok and record.end_s >= record.sent_s


def test_unreachable_server() -> None:
    record = run(send_one(Target("http://127.0.0.1:9", "m"), SPEC))
    assert record.error == "connect_error" and "127.0.0.1:9" in record.error_detail


def test_timeout() -> None:
    record = against(_never, {"timeout_s": 0.3})
    assert record.error == "timeout"
    # uvloop keeps its timers in whole milliseconds: the deadline may fire up to 1 ms early
    # by the clock the record is stamped with (a clean clone's CI run saw 0.29937 s).
    assert 0.3 - 0.001 <= record.end_s - record.sent_s < 5


# -- what counts as content, and unusual but valid streams ------------------------------


GOOD_STREAMS: list[tuple[str, Reply, int]] = [
    ("role, 2 tokens, usage", sse(ROLE, chat("a"), chat("b"), USAGE, b"[DONE]"), 2),
    ("escaped quote and unicode", sse(ROLE, chat('"'), chat("é"), chat("\\"), chat(" "), USAGE), 4),
    (
        "spaces in json",
        sse(
            b'{"choices": [{"delta": {"content": "x"}}]}',
            b'{"choices": [{"delta": {"content": ""}}]}',
            USAGE,
        ),
        1,
    ),
    ("null content", sse(b'{"choices":[{"delta":{"content":null}}]}', chat("x"), USAGE), 1),
    (
        "reasoning counts",
        sse(b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}', chat("x"), USAGE),
        2,
    ),
    (
        "comments and fields",
        sse(b": ping", b"event: message\nid: 1\ndata: " + chat("x"), chat("y"), USAGE),
        2,
    ),
    (
        "usage in every chunk",
        sse(*[chat("t")[:-1] + b',"usage":{"completion_tokens":%d}}' % i for i in (1, 2, 3)]),
        3,
    ),
]


@pytest.mark.parametrize(
    ("reply", "tokens"), [c[1:] for c in GOOD_STREAMS], ids=[c[0] for c in GOOD_STREAMS]
)
def test_content_chunks_are_counted(reply: Reply, tokens: int) -> None:
    record = against(reply)
    assert record.ok, (record.error, record.error_detail)
    assert len(record.chunk_s) == tokens


def test_usage_is_read_and_its_absence_counted() -> None:
    async def go() -> tuple[RequestRecord, RequestRecord, int]:
        async with RawServer(sse(ROLE, chat("a"), chat("b"), USAGE, b"[DONE]")) as url:
            with_usage = await send_one(Target(url, "m"), SPEC)
        async with RawServer(sse(ROLE, chat("a"), b"[DONE]")) as url:
            client = Client(Target(url, "m"))
            without = await client.send(SPEC)
            await client.aclose()
        return with_usage, without, client.no_usage

    with_usage, without, no_usage = run(go())
    assert (with_usage.input_tokens, with_usage.output_tokens) == (3, 2)
    assert without.ok and without.output_tokens is None and no_usage == 1


def test_crlf_length_and_close_framed_streams() -> None:
    events = b"".join(b"data: " + e + b"\r\n\r\n" for e in (ROLE, chat("a"), USAGE))

    async def by_length(request: bytes, transport: asyncio.Transport) -> None:
        transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(events), events)
        )

    async def until_close(request: bytes, transport: asyncio.Transport) -> None:
        transport.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + events)
        transport.close()

    for reply in (by_length, until_close):
        record = against(reply)
        assert record.ok and len(record.chunk_s) == 1 and record.output_tokens == 2


def test_request_carries_the_spec() -> None:
    spec = RequestSpec(
        0, "now?", 9, 2, history=(("user", "hi"), ("assistant", "yo")), priority=0, session_id="s-1"
    )
    server = RawServer(sse(chat("a"), USAGE))

    async def go() -> None:
        async with server as url:
            target = Target(url, "m", api_key="k", temperature=0.0, headers=(("X-T", "1"),))
            await send_one(target, spec)

    run(go())
    head, body = server.requests[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1")
    for header in (b"X-Priority: 0", b"X-Session-Id: s-1", b"Authorization: Bearer k", b"X-T: 1"):
        assert header in head
    payload = json.loads(body)
    assert payload["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "now?"},
    ]
    assert payload["max_tokens"] == 9 and payload["stream"] is True and payload["ignore_eos"]
    assert payload["stream_options"] == {"include_usage": True} and payload["temperature"] == 0


def test_stale_kept_alive_connection_is_retried() -> None:
    async def answer_then_close(request: bytes, transport: asyncio.Transport) -> None:
        await sse(chat("a"), USAGE)(request, transport)
        await asyncio.sleep(0.01)
        transport.close()  # without saying `connection: close` first

    async def go() -> list[RequestRecord]:
        async with RawServer(answer_then_close) as url:
            client = Client(Target(url, "m"))
            first = await client.send(SPEC)
            await asyncio.sleep(0.1)
            second = await client.send(SPEC)
            await client.aclose()
            return [first, second]

    assert all(r.ok for r in run(go()))
