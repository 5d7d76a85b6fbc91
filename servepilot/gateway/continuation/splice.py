"""The continuation's events rewritten as the rest of the first answer (pure).

The client must read one answer: every event carries the first part's `id` and `created`;
a chat continuation's role event is dropped (the role went out with the first part); the
usage event, when the client asked for usage, counts both parts; `[DONE]` comes once, from
the last part. Events arrive in pieces of any size: `feed` keeps what does not end an event
yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from servepilot.gateway.continuation.transcript import DONE, EVENT_END, Transcript

_DATA = b"data: "


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class Splicer:
    """Rewrites one continuation's SSE body, piece by piece."""

    sent: Transcript
    """The answer the client had read before this part (every earlier part)."""
    usage_asked: bool
    """The client asked for a usage event (stream_options.include_usage)."""
    _pending: bytes = b""
    tokens: int = 0
    """Content events of this part."""
    usage: Usage | None = None
    """This part's own usage, once its usage event came."""
    finish_reason: str | None = None
    done: bool = False
    """`[DONE]` was passed on."""
    error: str | None = None
    """The replica's error event, when it sent one (nothing after it is passed on)."""
    _texts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self._texts)

    def feed(self, data: bytes) -> bytes:
        """The client's bytes for `data`, the next piece of the continuation's body."""
        pending = self._pending + data
        cut = pending.rfind(EVENT_END)
        if cut < 0:
            self._pending = pending
            return b""
        self._pending = pending[cut + len(EVENT_END) :]
        out = []
        for event in pending[:cut].split(EVENT_END):
            out.append(self._event(event))
            if self.error is not None:
                break
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        stripped = event.strip()
        if not stripped.startswith(_DATA):
            return b""  # a comment or an empty line: nothing the client needs
        payload = stripped[len(_DATA) :].strip()
        if payload == DONE:
            self.done = True
            return _DATA + DONE + EVENT_END
        try:
            doc = json.loads(payload)
        except (ValueError, RecursionError):
            return stripped + EVENT_END
        if not isinstance(doc, dict):
            return stripped + EVENT_END
        if "error" in doc:  # its engine failed: not relayed, the part is given up on
            self.error = stripped.decode("utf-8", "replace")[:300]
            return b""
        rewritten = self._rewrite(doc)
        return b"" if rewritten is None else _DATA + _dumps(rewritten) + EVENT_END

    def _rewrite(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        if self.sent.answer_id is not None:
            doc["id"] = self.sent.answer_id
        if self.sent.created is not None:
            doc["created"] = self.sent.created
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(_int(usage, "prompt_tokens"), _int(usage, "completion_tokens"))
            if not doc.get("choices"):  # the usage event of include_usage
                if not self.usage_asked:
                    return None
                doc["usage"] = self.summed_usage()
                return doc
            doc["usage"] = self.summed_usage() if self.usage_asked else None
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                del delta["role"]
                if not delta.get("content") and choice.get("finish_reason") is None:
                    return None  # the role event alone
            piece = choice.get("text") if "text" in choice else (delta or {}).get("content")
            if isinstance(piece, str):
                self.tokens += 1
                self._texts.append(piece)
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        return doc

    def summed_usage(self) -> dict[str, int]:
        """Usage of the whole answer: the continuation's prompt held the first part's
        tokens, which count as completion tokens, once."""
        own = self.usage or Usage()
        sent = self.sent.tokens
        prompt = max(own.prompt_tokens - sent, 0)
        completion = own.completion_tokens + sent
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                "completion_tokens": completion}  # fmt: skip

    def transcript(self) -> Transcript:
        """Everything the client has read once this part stops (for a further continuation)."""
        sent = self.sent
        return Transcript(
            answer_id=sent.answer_id,
            created=sent.created,
            text=sent.text + self.text,
            tokens=sent.tokens + self.tokens,
            events=sent.events,
            finish_reason=self.finish_reason,
            whole_events=not self._pending,
        )


def _int(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name)
    return value if isinstance(value, int) else 0


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()
