"""Steady streaming load for bench_chaos.py, and the check of every stream it sent.

Each stream goes through the official `openai` client (completions and chats in turn, greedy,
`ignore_eos`, so every answer is exactly --max-tokens tokens ending with "length"). The
transport under the client keeps the raw body too, to count what the client cannot see: it
stops reading at the first `data: [DONE]`, so a second one would pass unnoticed.

Token events are not tokens: vLLM sends one event per token while its API server keeps up,
and merges the tokens of several steps into one event when it falls behind (a loaded CPU).
So an answer's length is its usage, and the events of an honest stream are at most that.

A stream is
- completed: one `id`, one `created`, usage of max_tokens completion tokens, between one and
  that many token events, one finish_reason ("length"), [DONE] once;
- duplicated: more token events than its usage counts, a second finish_reason or a second
  [DONE] (a token relayed twice, or a seam the client sees);
- cut: it failed while the gateway itself was down (killed, restarting): the client's to
  retry, and it is sent again;
- refused: the gateway answered 502 or 503 before any token (no replica ready: both down,
  or the only one up failing its checks under load); sent again, as the `openai` client's
  own retries would;
- failed: anything else (an error event, an exception, tokens missing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

MODEL = "smollm2"
TOPICS = ("the sea", "a clock", "a red fox", "winter", "a library", "trains", "the moon",
          "a garden", "bridges", "an old map", "rain", "mountains")  # fmt: skip


class Tee(httpx.HTTPTransport):
    """An HTTP transport that keeps the last response's headers and raw body (one request at
    a time: one per worker thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw = bytearray()
        self.headers: httpx.Headers = httpx.Headers()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.raw = bytearray()
        self.headers = response.headers
        response.stream = _Kept(response.stream, self.raw)  # type: ignore[arg-type]
        return response


class _Kept(httpx.SyncByteStream):
    def __init__(self, stream: Any, kept: bytearray) -> None:
        self._stream = stream
        self._kept = kept

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            self._kept += chunk
            yield chunk

    def close(self) -> None:
        self._stream.close()


@dataclass
class Stream:
    index: int
    chat: bool
    started_s: float
    """time.monotonic() when it was sent."""
    replica: str | None = None
    """The replica the gateway sent it to first (X-Servepilot-Replica)."""
    token_s: list[float] = field(default_factory=list)
    """When each token event arrived."""
    ids: set[str] = field(default_factory=set)
    created: set[int] = field(default_factory=set)
    finishes: list[str] = field(default_factory=list)
    completion_tokens: int | None = None
    dones: int = 0
    error: str | None = None
    ended_s: float = 0.0
    cut: bool = False
    """It failed while the gateway was down (set by the load, which sends it again)."""
    refused: bool = False
    """The gateway refused it (502/503) before any token (the load sends it again)."""

    @property
    def ttft_s(self) -> float | None:
        return self.token_s[0] - self.started_s if self.token_s else None

    @property
    def tpot_s(self) -> float | None:
        if len(self.token_s) < 2:
            return None
        return (self.token_s[-1] - self.token_s[0]) / (len(self.token_s) - 1)

    def verdict(self, max_tokens: int) -> str:
        if self.cut:
            return "cut"
        if self.refused:
            return "refused"
        events, usage = len(self.token_s), self.completion_tokens
        if len(self.finishes) > 1 or self.dones > 1 or (usage is not None and events > usage):
            return "duplicated"
        whole = (
            self.error is None and usage == max_tokens and 1 <= events <= max_tokens
            and self.finishes == ["length"] and self.dones == 1
            and len(self.ids) == 1 and len(self.created) == 1
        )  # fmt: skip
        return "completed" if whole else "failed"


@dataclass
class Load:
    """`concurrency` workers sending `streams` streams at least, and more while `going`
    (and again those cut), to `url`."""

    url: str
    streams: int
    concurrency: int
    max_tokens: int
    gateway_down: Callable[[], bool]
    """Whether the gateway is down now (a failure then is a cut, not a failure)."""
    going: Callable[[], bool]
    """Whether to go on past `streams` (faults still to come)."""
    sent: list[Stream] = field(default_factory=list)
    active: dict[int, Stream] = field(default_factory=dict)
    """The streams being read now, by worker."""
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def started(self) -> int:
        return self._next

    def start(self) -> None:
        for n in range(self.concurrency):
            thread = threading.Thread(target=self._worker, args=(n,), name=f"load-{n}",
                                      daemon=True)  # fmt: skip
            thread.start()
            self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def mid_answer(self, replica: str) -> bool:
        """Whether a stream on `replica` is being read now, its first token come."""
        return any(s.replica == replica and s.token_s for s in list(self.active.values()))

    def _take(self) -> int | None:
        with self._lock:
            if self._next >= self.streams and not self.going():
                return None
            self._next += 1
            return self._next - 1

    def _worker(self, worker: int) -> None:
        tee = Tee()
        timeout = httpx.Timeout(300.0, connect=5.0)
        with httpx.Client(transport=tee, timeout=timeout) as http:
            client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0,
                                   http_client=http)  # fmt: skip
            while (index := self._take()) is not None:
                while True:
                    stream = self._one(client, tee, index, worker)
                    with self._lock:
                        self.sent.append(stream)
                    if not (stream.cut or stream.refused):
                        break
                    time.sleep(0.5)  # the client's retry of a stream its gateway dropped

    def _one(self, client: openai.OpenAI, tee: Tee, index: int, worker: int) -> Stream:
        chat = index % 2 == 1
        stream = self.active[worker] = Stream(index, chat, time.monotonic())
        prompt = f"Write a few lines about {TOPICS[index % len(TOPICS)]} (note {index}):"
        common: dict[str, Any] = {
            "model": MODEL, "max_tokens": self.max_tokens, "temperature": 0.0, "seed": index,
            "stream": True, "stream_options": {"include_usage": True},
            "extra_body": {"ignore_eos": True},
        }  # fmt: skip
        try:
            if chat:
                messages: Any = [{"role": "user", "content": prompt}]
                chunks: Any = client.chat.completions.create(messages=messages, **common)
            else:
                chunks = client.completions.create(prompt=prompt, **common)
            stream.replica = tee.headers.get("x-servepilot-replica")
            for chunk in chunks:
                _read(stream, chunk, chat)
        except openai.APIStatusError as exc:
            stream.error = f"{type(exc).__name__}: {exc}"[:300]
            stream.refused = exc.status_code in (502, 503) and not stream.token_s
        except (openai.OpenAIError, httpx.HTTPError) as exc:
            stream.error = f"{type(exc).__name__}: {exc}"[:300]
        stream.ended_s = time.monotonic()
        del self.active[worker]
        stream.dones = bytes(tee.raw).count(b"data: [DONE]")
        if stream.error is not None and self.gateway_down():
            stream.cut = True
        return stream


def _read(stream: Stream, chunk: Any, chat: bool) -> None:
    now = time.monotonic()
    stream.ids.add(chunk.id)
    stream.created.add(chunk.created)
    if chunk.usage is not None:
        stream.completion_tokens = chunk.usage.completion_tokens
    for choice in chunk.choices:
        # A chat's role event (content "") carries no token; its token events have content.
        piece = (None if choice.delta.role else choice.delta.content) if chat else choice.text
        if piece is not None:
            stream.token_s.append(now)
        if choice.finish_reason is not None:
            stream.finishes.append(choice.finish_reason)
