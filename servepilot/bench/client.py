"""Sends one `RequestSpec` as a streamed OpenAI request and returns what happened.

Every request asks for `stream`, `stream_options.include_usage` (token counts from the
server, not from a client tokenizer) and vLLM's `ignore_eos` (so an answer has exactly
`max_tokens` tokens and every run of a workload does the same work). Nothing a server does
raises out of `Client.send`: an unreachable URL, an HTTP error, an HTML page, a cut stream,
malformed events or a timeout each become a failed `RequestRecord` with a short reason:

    connect_error  connection_closed  timeout  http_<code>  not_openai  not_streamed
    malformed_http  malformed_sse  stream_error  stream_interrupted  no_content
    cancelled_at_end (the run ended first)  client_error (a bug here; detail says what)
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from servepilot.bench.records import Endpoint, RequestRecord, RequestSpec
from servepilot.bench.sse import EventScanner, parse_usage
from servepilot.bench.wire import RETRY, Answer, Connection, Pool
from servepilot.core.errors import ConfigError
from servepilot.http1.errors import Unreachable

_PATHS = {Endpoint.CHAT: "/chat/completions", Endpoint.COMPLETIONS: "/completions"}


@dataclass(frozen=True, slots=True)
class Target:
    """The server under test and how to talk to it."""

    base_url: str
    """Its root, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted too)."""
    model: str
    endpoint: Endpoint = Endpoint.CHAT
    api_key: str | None = None
    timeout_s: float = 600.0
    """Per request, from send to the end of the answer."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra request headers, sent with every request."""
    temperature: float | None = None
    """Sent when set (0 makes answers deterministic where the server honours it)."""
    ignore_eos: bool = True
    verify_tls: bool = True

    def __post_init__(self) -> None:
        url = urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(
                f"--url must be an http:// or https:// URL, got {self.base_url!r}",
                hint="for example --url http://127.0.0.1:8000",
            )
        if not self.timeout_s > 0:
            raise ConfigError(f"the request timeout must be above 0 s, got {self.timeout_s}")
        for name, value in (*self.headers, ("model", self.model), ("api key", self.api_key or "")):
            if "\r" in name + value or "\n" in name + value:
                raise ConfigError(f"header {name!r} contains a line break")

    @property
    def path(self) -> str:
        base = urlsplit(self.base_url).path.rstrip("/")
        return (base if base.endswith("/v1") else base + "/v1") + _PATHS[self.endpoint]


def _clean(value: str) -> str:
    return value.replace("\r", " ").replace("\n", " ")


class Client:
    """Sends requests to one target over a pool of kept-alive connections.

    Times in its records are seconds since `t0` (a `time.perf_counter()` value; the
    client's creation when not given). Create and use it inside one running event loop.
    `sent_s` is taken before a connection is picked or opened, so a new connection's setup
    counts in that request's latency, as it would for a user.
    """

    def __init__(self, target: Target, *, t0: float | None = None, keep_text: bool = False) -> None:
        self.target = target
        self.no_usage = 0
        """Successful answers whose stream carried no usage (token counts then unknown)."""
        url = urlsplit(target.base_url)
        tls = _tls(target.verify_tls) if url.scheme == "https" else None
        port = url.port or (443 if tls is not None else 80)
        t0 = time.perf_counter() if t0 is None else t0
        # Timeouts are checked by a periodic sweep: every twentieth of the timeout, at most 1 s.
        sweep_s = min(1.0, target.timeout_s / 20)
        endpoint = target.endpoint
        self._pool = Pool(
            url.hostname or "",
            port,
            tls,
            lambda: EventScanner(endpoint, keep_text=keep_text),
            t0,
            sweep_s,
        )
        self._head = _head_prefix(target, url.hostname or "", url.port)
        self._aborted: asyncio.Future[None] | None = None
        self._stopped: tuple[str, str] | None = None
        """(error, detail) for every request once `abort_all` was called."""

    @property
    def t0(self) -> float:
        return self._pool.t0

    @t0.setter
    def t0(self, value: float) -> None:
        """Moves the time origin (before the first request: earlier records keep theirs)."""
        self._pool.t0 = value

    async def preconnect(self, count: int) -> int:
        """Open up to `count` kept-alive connections ahead of the load; how many opened."""
        results = await asyncio.gather(
            *(self._pool.connect() for _ in range(count)), return_exceptions=True
        )
        opened = [c for c in results if isinstance(c, Connection)]
        for conn in opened:
            self._pool.release(conn)
        return len(opened)

    def prepare(self, spec: RequestSpec) -> bytes:
        """The whole HTTP request for `spec`, ready to write (prepare once, send many times)."""
        target = self.target
        payload: dict[str, Any] = {"model": target.model}
        if target.endpoint is Endpoint.CHAT:
            messages = [{"role": role, "content": text} for role, text in spec.history]
            messages.append({"role": "user", "content": spec.prompt})
            payload["messages"] = messages
        else:
            payload["prompt"] = spec.prompt
        payload.update(
            max_tokens=spec.max_tokens, stream=True, stream_options={"include_usage": True}
        )
        if target.ignore_eos:
            payload["ignore_eos"] = True
        if target.temperature is not None:
            payload["temperature"] = target.temperature
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        head = self._head
        if spec.priority is not None:
            head += b"X-Priority: %d\r\n" % spec.priority
        if spec.session_id is not None:
            head += b"X-Session-Id: " + _clean(spec.session_id).encode() + b"\r\n"
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def send(
        self,
        spec: RequestSpec,
        prepared: bytes | None = None,
        *,
        intended_s: float | None = None,
        warmup: bool = False,
    ) -> RequestRecord:
        """Send `spec` (as `prepared` by `prepare`, when given) and wait for the whole answer."""
        record, _ = await self.converse(spec, prepared, intended_s=intended_s, warmup=warmup)
        return record

    async def converse(
        self,
        spec: RequestSpec,
        prepared: bytes | None = None,
        *,
        intended_s: float | None = None,
        warmup: bool = False,
    ) -> tuple[RequestRecord, str]:
        """`send`, with the answer's text (empty unless the client was made to `keep_text`)."""
        sent = time.perf_counter() - self.t0
        try:
            answer = await self._exchange(self.prepare(spec) if prepared is None else prepared)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug of ours must cost one request, not the run
            now = time.perf_counter() - self.t0
            answer = Answer("client_error", f"{type(exc).__name__}: {exc}", [], None, None, now)
        intended = sent if intended_s is None else intended_s
        return self._record(spec, answer, sent, intended, warmup), answer.text

    def _record(
        self, spec: RequestSpec, answer: Answer, sent: float, intended: float, warmup: bool
    ) -> RequestRecord:
        chunks = answer.chunks
        prompt_tokens, output_tokens = parse_usage(answer.usage)
        if answer.error is None and answer.usage is None:
            self.no_usage += 1
        end = chunks[-1] if answer.error is None else answer.done_s
        return RequestRecord(
            index=spec.index,
            intended_s=intended,
            sent_s=sent,
            chunk_s=tuple(chunks),
            end_s=end,
            input_tokens=prompt_tokens,
            output_tokens=output_tokens,
            error=answer.error,
            error_detail=answer.detail,
            warmup=warmup,
            replica=answer.replica,
            extra={"done_s": answer.done_s},
            retry_after_s=answer.retry_after_s,
            turn=spec.turn,
        )

    async def _exchange(self, request: bytes) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.target.timeout_s
        conn = self._pool.take()
        for _attempt in range(2):
            if conn is None:
                got = await self._connect(deadline)
                if isinstance(got, Answer):
                    return got
                conn = got
            if self._stopped is not None:
                conn.abort()
                return Answer(*self._stopped, [], None, None, time.perf_counter() - self.t0)
            waiter: asyncio.Future[Answer] = loop.create_future()
            conn.start(request, waiter, deadline)
            try:
                answer = await waiter
            except asyncio.CancelledError:
                conn.abort()
                raise
            if answer.error != RETRY:
                return answer
            conn = None  # the server had closed that kept-alive connection: use a new one
        return answer

    async def _connect(self, deadline: float) -> Connection | Answer:
        """A new connection, or the failure that prevented it (also when the run ends first)."""
        loop = asyncio.get_running_loop()
        if self._aborted is None:
            self._aborted = loop.create_future()
        connecting = asyncio.ensure_future(self._pool.connect(deadline - loop.time()))
        done, _ = await asyncio.wait(
            (connecting, self._aborted), return_when=asyncio.FIRST_COMPLETED
        )
        now = time.perf_counter() - self.t0
        if connecting not in done:  # the run ended first
            connecting.cancel()
            return Answer(*(self._stopped or ("cancelled", "")), [], None, None, now)
        exc = connecting.exception()
        if isinstance(exc, Unreachable) and exc.timed_out:
            return Answer("timeout", "could not connect within the timeout", [], None, None, now)
        if exc is not None:
            detail = f"{self.target.base_url}: {exc or type(exc).__name__}"
            return Answer("connect_error", detail, [], None, None, now)
        return connecting.result()

    def abort_all(self, error: str, detail: str = "") -> None:
        """End every request in flight now, each with `error` (e.g. `cancelled_at_end`)."""
        self._stopped = (error, detail)
        if self._aborted is not None and not self._aborted.done():
            self._aborted.set_result(None)
        self._pool.abort_all(error, detail)

    async def aclose(self) -> None:
        self.abort_all("cancelled", "the client was closed")
        await asyncio.sleep(0)  # let the transports run their connection_lost


def _tls(verify: bool) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _head_prefix(target: Target, host: str, port: int | None) -> bytes:
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    lines = [
        f"POST {target.path} HTTP/1.1",
        f"Host: {netloc}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        "User-Agent: servepilot-bench",
    ]
    if target.api_key:
        lines.append(f"Authorization: Bearer {target.api_key}")
    lines += [f"{name}: {value}" for name, value in target.headers]
    return ("\r\n".join(lines) + "\r\n").encode("latin-1", "replace")


async def send_one(target: Target, spec: RequestSpec) -> RequestRecord:
    """One request on a fresh client: for probes and tests."""
    client = Client(target)
    try:
        return await client.send(spec)
    finally:
        await client.aclose()
