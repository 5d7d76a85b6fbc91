"""A non-streamed answer that can be continued: asked of the replica as a stream, handed to
the client whole (pure: dicts and bytes).

A replica answers a non-streamed request only once it has generated all of it, so a
replica that dies mid-generation leaves nothing to continue from. The gateway asks such a
request as a stream instead, keeps the events, and answers with the one answer they make,
in vLLM's non-streamed shape: the first part's `id` and `created`, the text of every part,
the last `finish_reason`, `usage` counting both parts (the splicer summed it).

Only plain requests are asked so: their whole answer is rebuilt exactly from the stream.
Tools, logprobs, an echoed prompt or several choices would each need more of the events
than their text, so those are passed on as vLLM writes them (and retried from the start).
"""

from __future__ import annotations

import json
from typing import Any

from servepilot.gateway.continuation.transcript import EVENT_END, event_doc

_NOT_PLAIN = ("tools", "functions", "logprobs", "top_logprobs", "prompt_logprobs", "echo",
              "return_token_ids", "return_tokens_as_token_ids")  # fmt: skip


def plain(doc: dict[str, Any], *, chat: bool) -> bool:
    """Whether the whole answer to `doc` can be rebuilt from its stream's events."""
    if doc.get("n") not in (None, 1) or doc.get("best_of") not in (None, 1):
        return False
    # `is`, not `in`: a completion's `logprobs: 0` (the chosen token's) is asked for.
    if any(doc.get(name) is not None and doc[name] is not False for name in _NOT_PLAIN):
        return False
    if chat:
        return isinstance(doc.get("messages"), list)
    prompt = doc.get("prompt")
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
    )


def as_stream(doc: dict[str, Any]) -> bytes:
    """The body that asks `doc` as a stream with its usage (the client's answer has it)."""
    return json.dumps({**doc, "stream": True, "stream_options": {"include_usage": True}}).encode()


def whole_events(body: bytes) -> bytes:
    """`body` up to the end of its last whole event (a replica cut mid-event left the rest:
    nothing of it reached the client, so the continuation starts after the last whole one)."""
    cut = body.rfind(EVENT_END)
    return b"" if cut < 0 else body[: cut + len(EVENT_END)]


def assemble(events: bytes, *, chat: bool) -> bytes:
    """The non-streamed answer the SSE `events` (every part's, spliced) make."""
    head: dict[str, Any] = {}
    texts: list[str] = []
    reasoning: list[str] = []
    finish: str | None = None
    stop: str | int | None = None
    usage: dict[str, Any] | None = None
    for doc in _docs(events):
        if not head:
            head = {"id": doc.get("id"), "object": "", "created": doc.get("created"),
                    "model": doc.get("model")}  # fmt: skip
        if isinstance(doc.get("usage"), dict):
            usage = doc["usage"]
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            continue
        choice = choices[0]
        delta = choice.get("delta") if chat else choice
        if isinstance(delta, dict):
            piece = delta.get("content" if chat else "text")
            texts.append(piece if isinstance(piece, str) else "")
            thought = delta.get("reasoning_content")
            reasoning.append(thought if isinstance(thought, str) else "")
        if choice.get("finish_reason") is not None:
            finish, stop = choice["finish_reason"], choice.get("stop_reason")
    text = "".join(texts)
    answer: dict[str, Any]
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": []}
        if any(reasoning):
            message["reasoning_content"] = "".join(reasoning)
        answer = {"index": 0, "message": message}
    else:
        answer = {"index": 0, "text": text}
    answer.update(logprobs=None, finish_reason=finish, stop_reason=stop)
    kind = "chat.completion" if chat else "text_completion"
    doc = {**head, "object": kind, "choices": [answer], "usage": usage}
    return json.dumps(doc, separators=(",", ":")).encode()


def _docs(events: bytes) -> list[dict[str, Any]]:
    docs = (event_doc(event) for event in events.split(EVENT_END))
    return [doc for doc in docs if doc is not None and "error" not in doc]
