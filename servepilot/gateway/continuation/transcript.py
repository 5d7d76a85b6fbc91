"""What a client was sent of a streamed answer, and the request that generates the rest.

Pure: bytes and dicts in, bytes and dicts out. The relay keeps the SSE bytes it wrote to the
client; only when a stream breaks are they read here, so a stream that never breaks pays
nothing but keeping them.

Tokens are counted as content events: vLLM streams one event per generated token by default
(`--stream-interval 1`), so the count is what max_tokens is lowered by. The rest is asked
for as text, not token ids: for /v1/completions the prompt followed by the text sent so far,
for /v1/chat/completions the messages followed by the partial assistant message, continued
(vLLM's `continue_final_message`). A greedy continuation matches the undisturbed answer
token for token where the text re-tokenizes to the tokens it came from and the other
replica's numerics agree (see docs/gateway.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

EVENT_END = b"\n\n"
DONE = b"[DONE]"
_DATA = b"data: "


@dataclass(frozen=True, slots=True)
class Transcript:
    """The answer so far, as the client read it."""

    answer_id: str | None
    created: int | None
    text: str
    """The generated text relayed (choice 0)."""
    tokens: int
    """Content events relayed: generated tokens, one per event."""
    events: int
    """Every event relayed (the role event of a chat stream included)."""
    finish_reason: str | None
    """Set when the answer had already ended (only its usage or [DONE] went missing)."""
    whole_events: bool
    """The bytes end where an event does: more events can follow without a seam."""


def read_transcript(relayed: bytes, *, chat: bool) -> Transcript:
    """The answer so far in the SSE body `relayed` (the events as sent)."""
    whole = not relayed or relayed.endswith(EVENT_END)
    answer_id: str | None = None
    created: int | None = None
    parts: list[str] = []
    tokens = events = 0
    finish: str | None = None
    for event in relayed.split(EVENT_END):
        doc = event_doc(event)
        if doc is None:
            continue
        events += 1
        if answer_id is None and isinstance(doc.get("id"), str):
            answer_id = doc["id"]
            created = doc.get("created") if isinstance(doc.get("created"), int) else None
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            continue
        choice = choices[0]
        piece = _piece(choice, chat)
        if piece is not None:
            parts.append(piece)
            tokens += 1
        if isinstance(choice.get("finish_reason"), str):
            finish = choice["finish_reason"]
    return Transcript(answer_id, created, "".join(parts), tokens, events, finish, whole)


def event_doc(event: bytes) -> dict[str, Any] | None:
    event = event.strip()
    if not event.startswith(_DATA) or event[len(_DATA) :].strip() == DONE:
        return None
    try:
        doc = json.loads(event[len(_DATA) :])
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _piece(choice: dict[str, Any], chat: bool) -> str | None:
    """The generated text of one event's choice; None when it carries none (a role event)."""
    if chat:
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        if not isinstance(content, str) or (not content and "role" in (delta or {})):
            return None
        return content
    text = choice.get("text")
    return text if isinstance(text, str) else None


class NotContinuable(ValueError):
    """The request has no continuation as text (e.g. its prompt is token ids)."""


def continuation_body(doc: dict[str, Any], sent: Transcript, *, chat: bool) -> dict[str, Any]:
    """The request for the rest of the answer: the original `doc` with the text sent so far
    appended, max_tokens lowered by the tokens sent; sampling parameters and seed as they
    were. Usage is always asked for (the edge sums it, and drops it when the client did not
    ask)."""
    body = dict(doc)
    if body.get("n") not in (None, 1):  # the transcript follows choice 0 only
        raise NotContinuable("the request asked for several choices (n > 1)")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise NotContinuable("the request has no list of messages")
        if sent.text:  # else nothing generated reached the client: the messages as they were
            body["messages"] = [*messages, {"role": "assistant", "content": sent.text}]
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise NotContinuable("the prompt is not one string (token ids or a batch)")
        if body.get("echo"):  # the text sent starts with the prompt: not the generation
            raise NotContinuable("the request asked for its prompt echoed")
        body["prompt"] = prompt + sent.text
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            body[name] = value - sent.tokens
    body["stream"] = True  # a non-streamed answer is continued as a stream too
    options = body.get("stream_options")
    body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                              "include_usage": True}  # fmt: skip
    return body


def tokens_left(doc: dict[str, Any], sent: Transcript) -> int | None:
    """The output tokens the request may still make (None: no limit was asked)."""
    limits = [doc.get(name) for name in ("max_completion_tokens", "max_tokens")]
    asked = [v for v in limits if isinstance(v, int) and not isinstance(v, bool)]
    return None if not asked else asked[0] - sent.tokens


def usage_asked(doc: dict[str, Any]) -> bool:
    options = doc.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))
