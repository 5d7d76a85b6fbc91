"""The simulated replica's routes: vLLM's OpenAI server, answered by the real-time engine.

POST /v1/chat/completions, /v1/completions   streamed (SSE) or not
POST /v1/responses                            streamed (named SSE events) or not
GET  /v1/models, /health, /metrics (vLLM's names), /version
GET  /kv_event_sources                        where its KV events are published (kvconfig.py)
POST /tokenize, /detokenize                   vLLM's request and answer shapes
POST /sleep, /wake_up, GET /is_sleeping       with --enable-sleep-mode (sleep.py)

Any other route answers as vLLM 0.32 answers a route it did not register for its model (the
pooling routes, /v1/embeddings, /v1/score, /v1/rerank, /pooling, on a generative model; the
/v1/audio routes on one without speech-to-text): its web framework's `{"detail": "Not Found"}`
(405 `{"detail": "Method Not Allowed"}` for a known path).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from servepilot.engine.simserver.metrics import render
from servepilot.engine.simserver.openai_api import (
    ApiError,
    Job,
    StreamFormat,
    bad_request,
    check_model,
    parse_job,
    parse_json,
    whole_answer,
)
from servepilot.engine.simserver.realtime import RealtimeEngine
from servepilot.engine.simserver.responses_api import ResponseFormat, chat_request
from servepilot.engine.simserver.sinks import EventFormat, StreamSink, WholeSink
from servepilot.engine.simserver.sleep import SleepMode, SleepTimes, parse_level, parse_tags
from servepilot.engine.simserver.tokens import PromptTokenizer
from servepilot.http1 import HttpRequest, HttpServer, Limits

VLLM_VERSION = "0.32.0"
MAX_BODY_BYTES = 32 * 1024 * 1024
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"
_SSE = b"text/event-stream; charset=utf-8"

Route = Callable[[HttpRequest], Awaitable[None]]


def error_body(status: int, message: str, code: str) -> bytes:
    """vLLM's error body for what the HTTP server answers on its own (http1.ErrorBody):
    vLLM's `code` is the status, so the server's own code name is not sent."""
    error_type = "InternalServerError" if status >= 500 else "BadRequestError"
    return ApiError(status, message, error_type=error_type, param=None).body()


class SimApp:
    def __init__(
        self,
        engine: RealtimeEngine,
        tokenizer: PromptTokenizer,
        *,
        served_name: str,
        max_model_len: int,
        sleep: SleepTimes | None = None,
        drop_streams_after_tokens: int | None = None,
        kv_event_sources: dict[str, Any] | None = None,
        dev_routes: bool = False,
    ) -> None:
        """`sleep`: with --enable-sleep-mode, the sleep routes and what they take.
        `dev_routes`: the routes vLLM serves with VLLM_SERVER_DEV_MODE=1 that a simulated
        replica has a meaning for (POST /reset_prefix_cache, which benchmarks call between
        runs).
        `drop_streams_after_tokens`: a fault for tests (--drop-streams-after-tokens).
        `kv_event_sources`: the answer to GET /kv_event_sources (None: `{}`, none published)."""
        self.drop_after = drop_streams_after_tokens
        self.engine = engine
        self.tokenizer = tokenizer
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.draining = False
        self._created = int(time.time())
        self._kv_event_sources = json.dumps(kv_event_sources or {}).encode()
        self._routes: dict[tuple[str, str], Route] = {
            ("POST", "/v1/chat/completions"): functools.partial(self._generate, chat=True),
            ("POST", "/v1/completions"): functools.partial(self._generate, chat=False),
            ("POST", "/v1/responses"): self._responses,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/version"): self._version,
            ("GET", "/kv_event_sources"): self._kv_sources,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
        }
        self.sleep_mode = None if sleep is None else SleepMode(sleep, engine)
        if self.sleep_mode is not None:
            self._routes[("POST", "/sleep")] = self._sleep
            self._routes[("POST", "/wake_up")] = self._wake_up
            self._routes[("GET", "/is_sleeping")] = self._is_sleeping
        if dev_routes:
            self._routes[("POST", "/reset_prefix_cache")] = self._reset_prefix_cache

    def http_server(self) -> HttpServer:
        """The HTTP/1.1 server that answers with this app."""
        return HttpServer(self.handle, Limits(MAX_BODY_BYTES), error_body)

    async def handle(self, request: HttpRequest) -> None:
        """Answer one request; a failure the routes did not foresee is the server's 500."""
        route = self._routes.get((request.method, request.path))
        if route is None:
            known = any(path == request.path for _, path in self._routes)
            detail = b'{"detail":"Method Not Allowed"}' if known else b'{"detail":"Not Found"}'
            request.respond(405 if known else 404, detail)
            return
        try:
            await route(request)
        except ApiError as exc:
            request.respond(exc.status, exc.body())

    async def _generate(self, request: HttpRequest, *, chat: bool) -> None:
        doc = self._checked(request)
        job = parse_job(doc, chat=chat, tokenizer=self.tokenizer, max_model_len=self.max_model_len)
        if job.stream:
            await self._run(request, job, StreamFormat(job, self.served_name))
        else:
            await self._run(request, job, functools.partial(whole_answer, job, self.served_name))

    async def _responses(self, request: HttpRequest) -> None:
        doc = self._checked(request)
        chat = chat_request(doc)
        job = parse_job(chat, chat=True, tokenizer=self.tokenizer, max_model_len=self.max_model_len)
        answer = ResponseFormat(job, self.served_name, doc)
        await self._run(request, job, answer if job.stream else answer.whole)

    def _checked(self, request: HttpRequest) -> dict[str, Any]:
        if self.draining:
            raise ApiError(503, "the server is shutting down", error_type="ServiceUnavailable",
                           param=None)  # fmt: skip
        doc = parse_json(request.body)
        check_model(doc, self.served_name)
        return doc

    async def _run(
        self, request: HttpRequest, job: Job, answer: EventFormat | Callable[[], bytes]
    ) -> None:
        """Queue the generation and wait until its sink has answered (a stream's events, or
        the whole `answer` rendered at the end); a client that leaves cancels the wait,
        which takes the request out of the engine."""
        if self.sleep_mode is not None:
            await self.sleep_mode.wait_awake()  # held as vLLM's paused scheduler holds it
        answered = asyncio.get_running_loop().create_future()
        sink: StreamSink | WholeSink
        if callable(answer):
            sink = WholeSink(request, answer, answered)
        else:
            # The head leaves at once, as vLLM's does, not with the first token.
            request.start_stream(200, _SSE)
            request.flush_head()
            sink = StreamSink(request, answer, answered, self.drop_after)
        request_id = self.engine.submit(
            job.prompt_ids, job.output_tokens, sink, arrived_at=request.received_at
        )
        try:
            await answered
        except asyncio.CancelledError:
            self.engine.abort(request_id)
            raise

    async def _sleep(self, request: HttpRequest) -> None:
        assert self.sleep_mode is not None
        await self.sleep_mode.sleep(parse_level(request.query))
        request.respond(200, b"")

    async def _wake_up(self, request: HttpRequest) -> None:
        assert self.sleep_mode is not None
        await self.sleep_mode.wake_up(parse_tags(request.query))
        request.respond(200, b"")

    async def _is_sleeping(self, request: HttpRequest) -> None:
        assert self.sleep_mode is not None
        answer = {"is_sleeping": self.sleep_mode.is_sleeping}
        request.respond(200, json.dumps(answer).encode())

    async def _reset_prefix_cache(self, request: HttpRequest) -> None:
        # vLLM drops its cached blocks and publishes AllBlocksCleared; so does the replica.
        self.engine.drop_prefix_cache()
        request.respond(200, b"")

    async def _health(self, request: HttpRequest) -> None:
        request.respond(200, b"")

    async def _version(self, request: HttpRequest) -> None:
        request.respond(200, b'{"version":"%s"}' % VLLM_VERSION.encode())

    async def _kv_sources(self, request: HttpRequest) -> None:
        request.respond(200, self._kv_event_sources)

    async def _models(self, request: HttpRequest) -> None:
        card = {
            "id": self.served_name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": self.served_name,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        request.respond(200, json.dumps({"object": "list", "data": [card]}).encode())

    async def _metrics(self, request: HttpRequest) -> None:
        text = render(self.served_name, self.engine.gauges(), self.engine.stats)
        request.respond(200, text.encode(), _PROMETHEUS)

    async def _tokenize(self, request: HttpRequest) -> None:
        doc = parse_json(request.body)
        check_model(doc, self.served_name)
        if "messages" in doc:
            messages = doc["messages"]
            if not isinstance(messages, list) or not messages:
                raise bad_request("`messages` must be a non-empty list", "messages")
            try:
                ids = self.tokenizer.chat(messages)
            except ValueError as exc:
                raise bad_request(str(exc), "messages") from None
        else:
            prompt = doc.get("prompt")
            if not isinstance(prompt, str):
                raise bad_request("`prompt` (a string) or `messages` is required", "prompt")
            special = doc.get("add_special_tokens", True)
            ids = self.tokenizer.encode(prompt, add_special_tokens=bool(special))
        answer: dict[str, Any] = {
            "count": len(ids),
            "max_model_len": self.max_model_len,
            "tokens": ids,
            "token_strs": None,
        }
        request.respond(200, json.dumps(answer).encode())

    async def _detokenize(self, request: HttpRequest) -> None:
        doc = parse_json(request.body)
        check_model(doc, self.served_name)
        tokens = doc.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise bad_request("`tokens` must be a list of token ids", "tokens")
        request.respond(200, json.dumps({"prompt": self.tokenizer.decode(tokens)}).encode())
