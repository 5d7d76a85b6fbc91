"""A zero-cost OpenAI-compatible streaming server, to measure load generators against.

Every byte of every answer is formatted once at start-up, so the server's own cost per request
is a header search and one write: what a client reports as TTFT against it is (almost) all
client overhead. Serves GET /v1/models, POST /v1/completions and POST /v1/chat/completions
(always streamed, the way vLLM streams: a role chunk, N content chunks, a finish chunk, a usage
chunk, [DONE], all in chunked transfer encoding), plus GET /health and GET /metrics (vLLM's load
gauges) so that routers can health-check and scrape it.

    python tests/support/stub_server.py --port 8765 --chunks 16 [--delay-ms 0]

prints `listening on PORT` once it accepts connections. Tests use `ThreadedStub`, which runs
the same server on its own event loop in a thread; with a chunk delay it also counts the
requests in flight (without one, each answer is written whole as its request arrives).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

MODEL = "stub-model"
REPLICA = "stub-0"


@dataclass(frozen=True, slots=True)
class StubConfig:
    chunks: int = 16
    """Content chunks per answer (each one token, so usage.completion_tokens = chunks)."""
    chunk_delay_s: float = 0.0
    """Pause before every content chunk; 0 writes the whole answer at once."""
    prompt_tokens: int = 32
    usage: bool = True
    """Send the final usage chunk (stream_options.include_usage)."""
    stall_at_request: int | None = None
    """Block the whole server for `stall_s` when this request (0-based) arrives: a GC pause."""
    stall_s: float = 0.0
    refuse_retry_after: str | None = None
    """Refuse every generation with 429 and this Retry-After header: a server shedding load."""


@dataclass(slots=True)
class StubStats:
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0


def _sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def _chunk(payload: bytes) -> bytes:
    return _frame(_sse(payload))


def _frame(event: bytes) -> bytes:
    """One piece of a chunked transfer encoding."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def _event(kind: str, body: dict[str, object]) -> bytes:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    full = {"id": "stub-1", "object": obj, "created": 0, "model": MODEL, **body}
    return _sse(json.dumps(full, separators=(",", ":")).encode())


def _choice(kind: str, text: str, role: bool = False, finish: str | None = None) -> object:
    if kind == "chat":
        delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


@dataclass(frozen=True, slots=True)
class AnswerEvents:
    """The SSE events of one streamed answer of one endpoint, as vLLM sends them (each a
    `data: ...` line and its blank line): what any stub, this server or another, streams."""

    first: tuple[bytes, ...]
    """Before the content: the role chunk of a chat answer."""
    token: bytes
    """One content chunk (one token); an answer sends it `chunks` times."""
    tail: tuple[bytes, ...]
    """The finish chunk, the usage chunk when asked for, [DONE]."""


def answer_events(kind: str, config: StubConfig) -> AnswerEvents:
    """`kind`: chat or completions."""
    first = (_event(kind, {"choices": [_choice(kind, "", role=True)]}),) if kind == "chat" else ()
    tail = [_event(kind, {"choices": [_choice(kind, "", finish="length")]})]
    if config.usage:
        usage = {
            "prompt_tokens": config.prompt_tokens,
            "completion_tokens": config.chunks,
            "total_tokens": config.prompt_tokens + config.chunks,
        }
        tail.append(_event(kind, {"choices": [], "usage": usage}))
    tail.append(_sse(b"[DONE]"))
    return AnswerEvents(first, _event(kind, {"choices": [_choice(kind, " tok")]}), tuple(tail))


class _Answer:
    """The preformatted byte pieces of one streamed answer of one endpoint."""

    HEAD = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\nx-servepilot-replica: " + REPLICA.encode() + b"\r\n\r\n"
    )

    def __init__(self, kind: str, config: StubConfig) -> None:
        events = answer_events(kind, config)
        self.first = self.HEAD + b"".join(_frame(e) for e in events.first)
        self.token = _frame(events.token)
        self.tail = b"".join(_frame(e) for e in events.tail) + b"0\r\n\r\n"
        self.whole = self.first + self.token * config.chunks + self.tail


def _plain(status: bytes, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        ctype,
        len(body),
        body,
    )


_MODELS = _plain(
    b"200 OK",
    json.dumps(
        {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "root": MODEL, "owned_by": "stub"}],
        }
    ).encode(),
)
_HEALTHY = _plain(b"200 OK", b"")


def _refusal(retry_after: str) -> bytes:
    body = b'{"error":{"message":"overloaded","code":429}}'
    head = b"HTTP/1.1 429 Too Many Requests\r\nretry-after: %s\r\n" % retry_after.encode()
    return head + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


_NOT_FOUND = _plain(b"404 Not Found", b'{"error":{"message":"no such route","code":404}}')


class _StubProtocol(asyncio.Protocol):
    def __init__(self, server: StubServer) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while (end := buf.find(b"\r\n\r\n")) >= 0:
            head = buf[:end]
            length = _content_length(head)
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4 : end + 4 + length]
            buf = buf[end + 4 + length :]
            self._answer(head, body)
        self.buf = buf

    def _answer(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        path = head[head.find(b" ") + 1 : head.find(b" HTTP/")]
        if path.endswith(b"/chat/completions"):
            self.server.stream(self.transport, self.server.chat, body)
        elif path.endswith(b"/completions"):
            self.server.stream(self.transport, self.server.completions, body)
        elif path.endswith(b"/models"):
            self.transport.write(_MODELS)
        elif path == b"/health":
            self.transport.write(_HEALTHY)
        elif path == b"/metrics":
            self.transport.write(self.server.metrics())
        else:
            self.transport.write(_NOT_FOUND)


_MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d+)')


def _content_length(head: bytes) -> int:
    at = head.lower().find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    line_end = head.find(b"\r\n", at + 2)
    return int(head[at + 17 : line_end if line_end >= 0 else len(head)])


class StubServer:
    def __init__(self, config: StubConfig | None = None) -> None:
        self.config = config or StubConfig()
        self.stats = StubStats()
        self.chat = _Answer("chat", self.config)
        self.completions = _Answer("completions", self.config)
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _StubProtocol(self), host, port, backlog=4096
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def metrics(self) -> bytes:
        """vLLM's load gauges, so a gateway in front scrapes what it would from vLLM."""
        label = f'{{model_name="{MODEL}"}}'
        text = (
            f"vllm:num_requests_running{label} {self.stats.in_flight}\n"
            f"vllm:num_requests_waiting{label} 0\n"
            f"vllm:kv_cache_usage_perc{label} 0.0\n"
        )
        return _plain(b"200 OK", text.encode(), b"text/plain; version=0.0.4")

    def stream(self, transport: asyncio.Transport, answer: _Answer, body: bytes = b"") -> None:
        stats, config = self.stats, self.config
        if config.stall_at_request == stats.requests:
            time.sleep(config.stall_s)  # deliberately blocks the loop: the whole server stalls
        stats.requests += 1
        if config.refuse_retry_after is not None:
            transport.write(_refusal(config.refuse_retry_after))
            return
        if config.chunk_delay_s <= 0:
            transport.write(answer.whole)
            return
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        transport.write(answer.first)
        # A streamed answer paced token by token stops at the request's max_tokens, as an
        # engine's does (a gateway continuing a broken stream asks for fewer).
        asked = _MAX_TOKENS.search(body)
        chunks = min(config.chunks, int(asked.group(1))) if asked else config.chunks
        self._later(transport, answer, max(chunks, 1))

    def _later(self, transport: asyncio.Transport, answer: _Answer, left: int) -> None:
        def step() -> None:
            if transport.is_closing():
                self.stats.in_flight -= 1
                return
            transport.write(answer.token)
            if left > 1:
                self._later(transport, answer, left - 1)
            else:
                transport.write(answer.tail)
                self.stats.in_flight -= 1

        asyncio.get_running_loop().call_later(self.config.chunk_delay_s, step)


class ThreadedStub:
    """The stub on its own event loop in a daemon thread (for tests); `url` once started."""

    def __init__(self, config: StubConfig | None = None) -> None:
        self.server = StubServer(config)
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedStub:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@contextlib.contextmanager
def threaded_stub(config: StubConfig | None = None) -> Iterator[ThreadedStub]:
    with ThreadedStub(config) as stub:
        yield stub


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    config = StubConfig(chunks=args.chunks, chunk_delay_s=args.delay_ms / 1000.0)

    async def serve() -> None:
        server = StubServer(config)
        port = await server.start(args.host, args.port)
        print(f"listening on {port}", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner, contextlib.suppress(KeyboardInterrupt):
        runner.run(serve())


if __name__ == "__main__":
    main()
