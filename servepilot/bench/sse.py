"""Server-sent events of an OpenAI-style stream, classified without parsing most of them.

A benchmark client spends most of its time on the streamed chunks, and a full `json.loads`
of every one of them is the main reason the usual clients top out early. So events are told
apart by cheap byte searches, and only the rare ones are fully parsed: the usage event (at the
end), errors, and anything that does not look like an OpenAI chunk.

Why byte searches are safe here: inside a JSON string every `"` is escaped as `\\"`, so the
byte sequence `"content"` followed by optional blanks and `:` can only be an object key;
and a string value is empty exactly when its opening quote is followed by the closing one.
`"reasoning_content"` and `"reasoning"` count as generated content too: a reasoning model is
decoding while it emits them, and leaving them out would report the whole reasoning phase
as time to first token.
"""

from __future__ import annotations

import json
import re

from servepilot.bench.records import Endpoint

_CHAT_KEYS = (b'"content"', b'"reasoning_content"', b'"reasoning"')
_COMPLETION_KEYS = (b'"text"',)
_BLANKS = b" \t\r\n"
_QUOTE, _OPEN_BRACE, _CLOSE_BRACE, _COLON = 0x22, 0x7B, 0x7D, 0x3A
_MAX_EXCERPT = 300
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def excerpt(raw: bytes | str, limit: int = _MAX_EXCERPT) -> str:
    """A short one-line rendering of what a server sent, for error details."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EventScanner:
    """Consumes the body of one streamed answer; reusable across answers via `reset`.

    After the body ended, `chunks` holds the arrival time of every event that carried
    generated content, `usage` the raw last event with a usage object, and `error` a short
    reason when the stream was not a well-formed OpenAI stream (then `detail` says why).
    With `keep_text` (a chat client that sends the answer back: the agentic workload), every
    content event is parsed after all and `text` is the answer.
    """

    __slots__ = (
        "_buf", "_key", "_keys", "_parts", "_sep", "chunks", "detail", "done", "error", "events",
        "keep_text", "usage",
    )  # fmt: skip

    def __init__(self, endpoint: Endpoint, *, keep_text: bool = False) -> None:
        self._keys = _CHAT_KEYS if endpoint is Endpoint.CHAT else _COMPLETION_KEYS
        self._key = self._keys[0]
        self.keep_text = keep_text
        self.reset()

    def reset(self) -> None:
        self._buf = b""
        self._sep = b""
        self.chunks: list[float] = []
        self.usage: bytes | None = None
        self.error: str | None = None
        self.detail = ""
        self.done = False
        self.events = 0
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """The answer's text (with `keep_text`; else empty)."""
        return "".join(self._parts)

    def feed(self, data: bytes, now: float) -> None:
        """Body bytes that arrived at `now`: every complete event in them is classified."""
        if self.error is not None:
            return
        if self._buf:
            data = self._buf + data
            self._buf = b""
        sep = self._sep or self._detect_separator(data)
        last = data.rfind(sep) if sep else -1
        if last < 0:
            self._buf = data
            return
        end = last + len(sep)
        if end < len(data):
            self._buf = data[end:]
        if sep == b"\n\n" and not self.keep_text and self._bulk(data, end, now):
            return
        start = 0
        while start < end:
            stop = data.find(sep, start, end)
            if stop > start:
                self._event(data, start, stop, now)
            start = stop + len(sep)

    def _bulk(self, data: bytes, end: int, now: float) -> bool:
        """Classify a run of complete events at once, by counting; False when unsure.

        The answer of a fast server often arrives in one read. Raw newlines only occur
        between SSE lines (JSON escapes them inside strings), so counts tell whether every
        event is a `data: {...}` or `data: [DONE]`, each object has one `choices`, and at
        most one (compact) content key each. Anything else (spaces after colons, errors,
        reasoning fields, comments, other fields) goes event by event.
        """
        events = data.count(b"\n\n", 0, end)
        if events < 3:
            return False
        objects = data.count(b"\n\ndata: {", 0, end) + data.startswith(b"data: {")
        dones = data.count(b"data: [DONE]\n\n", 0, end)
        if objects + dones != events or data.count(b"}\n\n", 0, end) != objects:
            return False
        if data.count(b'"choices"', 0, end) != objects or data.find(b'"error"', 0, end) >= 0:
            return False
        if data.find(b'"reasoning', 0, end) >= 0:
            return False
        key = self._key
        keys, strings = data.count(key, 0, end), data.count(key + b':"', 0, end)
        if keys > objects or (
            keys != strings and keys != strings + data.count(key + b":null", 0, end)
        ):
            return False
        usage, usages = data.count(b'"usage":{', 0, end), data.count(b'"usage"', 0, end)
        if usages != usage and usages != usage + data.count(b'"usage":null', 0, end):
            return False
        if usage:
            at = data.rfind(b'"usage":{', 0, end)
            start = data.rfind(b"\n\n", 0, at)
            self.usage = data[start + 8 if start >= 0 else 6 : data.find(b"\n\n", at, end)]
        content = strings - data.count(key + b':""', 0, end)
        if content:
            self.chunks += [now] * content
        self.events += events
        self.done = self.done or dones > 0
        return True

    def finish(self, now: float) -> None:
        """The body ended: an event the server did not close with a blank line still counts."""
        rest, self._buf = self._buf, b""
        if rest.strip(_BLANKS) and self.error is None:
            self._event(rest, 0, len(rest), now)

    def _detect_separator(self, data: bytes) -> bytes:
        # Lines end in "\n" (vLLM, most servers) or "\r\n" (sse-starlette); one stream uses one.
        newline = data.find(b"\n")
        if newline < 0:
            return b""
        self._sep = b"\r\n\r\n" if newline > 0 and data[newline - 1] == 0x0D else b"\n\n"
        return self._sep

    def _event(self, data: bytes, start: int, end: int, now: float) -> None:
        if data.startswith(b"data: ", start):
            at = start + 6
        elif data.startswith(b"data:", start):
            at = start + 5
        else:
            self._fields(data[start:end], now)
            return
        if data.find(b"\n", at, end) >= 0:
            self._fields(data[start:end], now)
            return
        self._payload(data, at, end, now)

    def _fields(self, event: bytes, now: float) -> None:
        """The general SSE event: comments, other fields, multi-line data."""
        lines = []
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                lines.append(line[6:] if line.startswith(b"data: ") else line[5:])
        if lines:
            payload = b"\n".join(lines)
            self._payload(payload, 0, len(payload), now)

    def _payload(self, data: bytes, at: int, end: int, now: float) -> None:
        if at >= end:
            return  # `data:` with nothing after it: a keep-alive, not an event
        self.events += 1
        if data[at] != _OPEN_BRACE or data[end - 1] != _CLOSE_BRACE:
            self._not_object(data[at:end], now)
            return
        choices = data.find(b'"choices"', at, end)
        if choices < 0:
            self._unusual(data[at:end])
            return
        if self._has_content(data, choices, end):
            self.chunks.append(now)
            if self.keep_text:
                self._parts.append(_answer_text(data[at:end]))
        usage = data.find(b'"usage"', choices, end)
        if usage >= 0:
            value = _value_at(data, usage + 7, end)
            if value >= 0 and data[value] == _OPEN_BRACE:
                self.usage = data[at:end]

    def _not_object(self, payload: bytes, now: float) -> None:
        payload = payload.strip(_BLANKS)
        if payload == b"[DONE]":
            self.done = True
        elif payload.startswith(b"{") and payload.endswith(b"}"):
            self.events -= 1
            self._payload(payload, 0, len(payload), now)
        elif payload:
            self._fail("malformed_sse", f"event is not JSON: {excerpt(payload)}")

    def _has_content(self, data: bytes, start: int, end: int) -> bool:
        compact = self._key + b':"'
        at = data.find(compact, start, end)
        if at >= 0 and data[at + len(compact)] != _QUOTE:
            return True  # the common case: a compact, non-empty string
        for key in self._keys:
            at = data.find(key, start, end)
            while at >= 0:
                value = _value_at(data, at + len(key), end)
                if value >= 0:
                    first = data[value]
                    if first == _QUOTE:
                        if value + 1 < end and data[value + 1] != _QUOTE:
                            return True
                    elif first in b"[{":
                        # Content parts (multimodal style): empty only as [] or {}.
                        inner = _skip_blanks(data, value + 1, end)
                        if inner < end and data[inner] not in b"]}":
                            return True
                at = data.find(key, at + len(key), end)
        return False

    def _unusual(self, payload: bytes) -> None:
        """An event without `choices`: a usage-only chunk, an error, or not OpenAI at all."""
        try:
            obj = json.loads(payload)
        except ValueError:
            self._fail("malformed_sse", f"event is not JSON: {excerpt(payload)}")
            return
        if not isinstance(obj, dict):
            self._fail("not_openai", f"event is not an object: {excerpt(payload)}")
        elif "error" in obj or obj.get("object") == "error":
            self._fail("stream_error", error_message(obj) or excerpt(payload))
        elif isinstance(obj.get("usage"), dict):
            self.usage = payload
        else:
            self._fail("not_openai", f"event without choices: {excerpt(payload)}")

    def _fail(self, reason: str, detail: str) -> None:
        if self.error is None:
            self.error, self.detail = reason, detail


def _answer_text(event: bytes) -> str:
    """The generated text of one chunk: choices[0].delta.content (chat) or choices[0].text;
    reasoning is not part of the answer a client sends back."""
    try:
        choice = json.loads(event)["choices"][0]
        text = choice["delta"].get("content") if "delta" in choice else choice.get("text")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    return text if isinstance(text, str) else ""


def _skip_blanks(data: bytes, at: int, end: int) -> int:
    while at < end and data[at] in _BLANKS:
        at += 1
    return at


def _value_at(data: bytes, at: int, end: int) -> int:
    """Where the value after a key ending at `at` starts; -1 if `at` is not `key: value`."""
    at = _skip_blanks(data, at, end)
    if at >= end or data[at] != _COLON:
        return -1
    at = _skip_blanks(data, at + 1, end)
    return at if at < end else -1


def error_message(obj: object) -> str:
    """The message of an OpenAI-shaped error body (`{"error": {"message": ...}}` or flat)."""
    if not isinstance(obj, dict):
        return ""
    inner = obj.get("error")
    if isinstance(inner, dict):
        obj = inner
    elif isinstance(inner, str):
        return excerpt(inner)
    message = obj.get("message")
    return excerpt(message) if isinstance(message, str) else ""


def parse_usage(event: bytes | None) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) of the usage event; Nones when absent or odd."""
    if event is None:
        return None, None
    # Two searches after the usage key cost a fraction of parsing the whole event; the
    # closing quote in each pattern keeps out `prompt_tokens_details` and the like.
    at = event.rfind(b'"usage"')
    prompt, completion = _PROMPT.search(event, at), _COMPLETION.search(event, at)
    if at >= 0 and prompt is not None and completion is not None:
        return int(prompt[1]), int(completion[1])
    try:
        usage = json.loads(event).get("usage")
    except (ValueError, AttributeError):
        return None, None
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) else None
