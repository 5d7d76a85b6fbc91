"""The simulated replica's routes: vLLM's OpenAI server, answered by the real-time engine.

POST /v1/chat/completions, /v1/completions   streamed (SSE) or not
GET  /v1/models, /health, /metrics (vLLM's names), /version
POST /tokenize, /detokenize                   vLLM's request and answer shapes
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from servepilot.engine.simserver.http import Exchange
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
from servepilot.engine.simserver.tokens import PromptTokenizer

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


class _StreamSink:
    """Writes each token's SSE event as the engine produces it."""

    __slots__ = ("exchange", "format")

    def __init__(self, exchange: Exchange, fmt: StreamFormat) -> None:
        self.exchange = exchange
        self.format = fmt

    def token(self, index: int) -> None:
        self.exchange.write(self.format.token(index))

    def finish(self) -> None:
        self.exchange.end_stream(self.format.end())


class _WholeSink:
    """Answers once the last token is generated."""

    __slots__ = ("exchange", "job", "served_name")

    def __init__(self, exchange: Exchange, job: Job, served_name: str) -> None:
        self.exchange = exchange
        self.job = job
        self.served_name = served_name

    def token(self, index: int) -> None:
        pass

    def finish(self) -> None:
        self.exchange.respond(200, whole_answer(self.job, self.served_name))


class SimApp:
    def __init__(
        self,
        engine: RealtimeEngine,
        tokenizer: PromptTokenizer,
        *,
        served_name: str,
        max_model_len: int,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.draining = False
        self._created = int(time.time())
        self._routes = {
            ("POST", "/v1/chat/completions"): lambda ex: self._generate(ex, chat=True),
            ("POST", "/v1/completions"): lambda ex: self._generate(ex, chat=False),
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): lambda ex: ex.respond(200, b""),
            ("GET", "/metrics"): self._metrics,
            ("GET", "/version"): lambda ex: ex.respond(
                200, b'{"version":"%s"}' % VLLM_VERSION.encode()
            ),
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
        }

    def handle(self, exchange: Exchange) -> None:
        request = exchange.request
        route = self._routes.get((request.method, request.path))
        try:
            if route is None:
                known = any(path == request.path for _, path in self._routes)
                raise ApiError(
                    405 if known else 404,
                    "Method Not Allowed" if known else "Not Found",
                    error_type="MethodNotAllowed" if known else "NotFoundError",
                    param=None,
                )
            route(exchange)
        except ApiError as exc:
            exchange.respond(exc.status, exc.body())
        except Exception:  # a bug here must not hang the client
            log.exception("%s %s failed", request.method, request.path)
            error = ApiError(500, "internal error", error_type="InternalServerError", param=None)
            if not exchange.done:
                exchange.respond(500, error.body())

    def _generate(self, exchange: Exchange, *, chat: bool) -> None:
        if self.draining:
            raise ApiError(503, "the server is shutting down", error_type="ServiceUnavailable",
                           param=None)  # fmt: skip
        doc = parse_json(exchange.request.body)
        check_model(doc, self.served_name)
        job = parse_job(doc, chat=chat, tokenizer=self.tokenizer, max_model_len=self.max_model_len)
        sink: _StreamSink | _WholeSink
        if job.stream:
            exchange.start_stream()
            sink = _StreamSink(exchange, StreamFormat(job, self.served_name))
        else:
            sink = _WholeSink(exchange, job, self.served_name)
        request_id = self.engine.submit(
            job.prompt_ids, job.output_tokens, sink, arrived_at=exchange.request.received_at
        )
        exchange.on_close = lambda: self.engine.abort(request_id)

    def _models(self, exchange: Exchange) -> None:
        card = {
            "id": self.served_name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": self.served_name,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        exchange.respond(200, json.dumps({"object": "list", "data": [card]}).encode())

    def _metrics(self, exchange: Exchange) -> None:
        text = render(self.served_name, self.engine.gauges(), self.engine.stats)
        exchange.respond(200, text.encode(), _PROMETHEUS)

    def _tokenize(self, exchange: Exchange) -> None:
        doc = parse_json(exchange.request.body)
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
        exchange.respond(200, json.dumps(answer).encode())

    def _detokenize(self, exchange: Exchange) -> None:
        doc = parse_json(exchange.request.body)
        check_model(doc, self.served_name)
        tokens = doc.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise bad_request("`tokens` must be a list of token ids", "tokens")
        exchange.respond(200, json.dumps({"prompt": self.tokenizer.decode(tokens)}).encode())
