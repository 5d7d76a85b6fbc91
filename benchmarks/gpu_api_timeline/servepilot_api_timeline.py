"""Timestamps along each request's way through vLLM's API server, for the GPU host probe.

A vLLM general plugin (entry point group `vllm.general_plugins`, declared by the dist-info
folder beside this file): with this folder on PYTHONPATH and `SERVEPILOT_API_TIMELINE` naming a
folder, every vLLM process loads it; the API server's process wraps five of vLLM 0.22's own
methods and writes, one JSON line each, to `<folder>/api-<pid>.jsonl`:

- `{"rid", "create", "render", "add_in", "add_out"}`: the chat route entered
  (`OpenAIServingChat.create_chat_completion`, the body parsed), the chat template rendered and
  the prompt tokenised (`render_chat_request` returned), `AsyncLLM.add_request` entered and
  returned (the request handed to the engine core);
- `{"rid", "queued", "scheduled"}`: the engine core's own events for it;
- `{"rid", "first_engine", "first_proc"}`: the step end that carried its first token (the engine
  core's timestamp) and when the output processor took it;
- `{"rid", "first_chunk", "second_chunk"}`: when the stream generator yielded its first two
  chunks (the role chunk, then the first token's);
- `{"po", "dur", "n", "ts"}`: each `OutputProcessor.process_outputs` call (start, seconds, outputs,
  the engine core's timestamp);
- `{"lag", "ms"}`: how late a 5 ms sleep woke on the event loop (only lags over 1 ms).

Every time is `time.monotonic()` (one clock for all processes of the host). The first line is
`{"wall", "mono"}`, one reading of both clocks. A vLLM whose methods differ leaves the method
unwrapped and says so in a `{"unwrapped"}` line; serving is never changed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import multiprocessing
import os
import threading
import time
from typing import Any

_ENV = "SERVEPILOT_API_TIMELINE"
_LAG_SLEEP_S = 0.005
_FLUSH_S = 1.0

_lines: list[str] = []
_lock = threading.Lock()
_holder: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "servepilot_api_timeline", default=None
)
_seen_first: set[str] = set()
_pending: dict[str, dict[str, float]] = {}
_lag_task: list[asyncio.Task[None]] = []


def _emit(record: dict[str, Any]) -> None:
    line = json.dumps(record, separators=(",", ":"))
    with _lock:
        _lines.append(line)


def _flusher(path: str) -> None:
    while True:
        time.sleep(_FLUSH_S)
        with _lock:
            batch = _lines[:]
            _lines.clear()
        if batch:
            with open(path, "a") as out:
                out.write("\n".join(batch) + "\n")


async def _lag_probe() -> None:
    while True:
        start = time.monotonic()
        await asyncio.sleep(_LAG_SLEEP_S)
        late_s = time.monotonic() - start - _LAG_SLEEP_S
        if late_s > 0.001:
            _emit({"lag": round(start, 6), "ms": round(late_s * 1e3, 3)})


def _wrap(owner: Any, name: str, make: Any) -> None:
    original = getattr(owner, name, None)
    if original is None:
        _emit({"unwrapped": f"{owner.__name__}.{name}"})
        return
    setattr(owner, name, functools.wraps(original)(make(original)))


def _chat(original: Any) -> Any:
    async def create_chat_completion(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if not _lag_task:
            _lag_task.append(asyncio.get_running_loop().create_task(_lag_probe()))
        _holder.set({"create": time.monotonic()})
        return await original(self, request, *args, **kwargs)

    return create_chat_completion


def _render(original: Any) -> Any:
    async def render_chat_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(self, *args, **kwargs)
        holder = _holder.get()
        if holder is not None:
            holder["render"] = time.monotonic()
        return result

    return render_chat_request


def _add(original: Any) -> Any:
    async def add_request(self: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        add_in = time.monotonic()
        result = await original(self, request_id, *args, **kwargs)
        holder = _pending.pop(request_id, None) or {}
        _emit({"rid": request_id, **holder, "add_in": add_in, "add_out": time.monotonic()})
        return result

    return add_request


def _process(original: Any) -> Any:
    def process_outputs(self: Any, outputs: Any, timestamp: Any = None, *args: Any,
                        **kwargs: Any) -> Any:  # fmt: skip
        if "engine_core_timestamp" in kwargs:
            timestamp = kwargs.pop("engine_core_timestamp")
        start = time.monotonic()
        for output in outputs:
            rid = output.request_id
            if output.events:
                stamps = {int(e.type): e.timestamp for e in output.events}
                _emit({"rid": rid, "queued": stamps.get(1), "scheduled": stamps.get(2)})
            if rid not in _seen_first and output.new_token_ids:
                _seen_first.add(rid)
                _emit({"rid": rid, "first_engine": timestamp, "first_proc": start})
        result = original(self, outputs, timestamp, *args, **kwargs)
        _emit({"po": start, "dur": round(time.monotonic() - start, 6), "n": len(outputs),
               "ts": timestamp})  # fmt: skip
        return result

    return process_outputs


def _stream(original: Any) -> Any:
    def chat_completion_stream_generator(
        self: Any, request: Any, result_generator: Any, request_id: str, *args: Any, **kwargs: Any
    ) -> Any:
        inner = original(self, request, result_generator, request_id, *args, **kwargs)
        holder = _holder.get()
        if holder is not None:  # vLLM runs the route in a task of its own (with_cancellation):
            _pending[request_id] = holder  # the stream, which adds the request, in another

        async def timed() -> Any:
            stamps: list[float] = []
            async for chunk in inner:
                if len(stamps) < 2:
                    stamps.append(time.monotonic())
                    if len(stamps) == 2:
                        _emit({"rid": request_id, "first_chunk": stamps[0],
                               "second_chunk": stamps[1]})  # fmt: skip
                yield chunk

        return timed()

    return chat_completion_stream_generator


def register() -> None:
    """vLLM's entry point: wrap, in the API server's process only."""
    folder = os.environ.get(_ENV)
    if not folder or multiprocessing.current_process().name != "MainProcess":
        return  # the engine core runs in a child process: nothing of the API server there
    try:
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.output_processor import OutputProcessor
    except ImportError as exc:
        _emit({"unwrapped": f"import: {exc}"})
        return
    if getattr(OpenAIServingChat, "_servepilot_timeline", False):
        return
    OpenAIServingChat._servepilot_timeline = True
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"api-{os.getpid()}.jsonl")
    _emit({"wall": time.time(), "mono": time.monotonic(), "pid": os.getpid()})
    _wrap(OpenAIServingChat, "create_chat_completion", _chat)
    _wrap(OpenAIServingChat, "render_chat_request", _render)
    _wrap(OpenAIServingChat, "chat_completion_stream_generator", _stream)
    _wrap(AsyncLLM, "add_request", _add)
    _wrap(OutputProcessor, "process_outputs", _process)
    threading.Thread(target=_flusher, args=(path,), daemon=True, name="api-timeline").start()
