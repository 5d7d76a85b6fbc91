"""The little the gateway checks in an inference request before forwarding its bytes.

Only what routing needs (`model`, `stream`) and what would make every replica refuse the
request anyway (missing `messages`/`prompt`, wrong types) is checked here; everything else
is the engine's to judge, and its 4xx answers are passed through unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from servepilot.gateway.errors import GatewayError, bad_request


@dataclass(slots=True)
class InferenceRequest:
    model: str | None
    """None when the body names none: as with vLLM, the fleet's only model serves it."""
    stream: bool
    prompt_chars: int
    doc: dict[str, Any]
    """The parsed body (read by prefix hashing; rewritten only to cap max_tokens)."""

    def __init__(
        self, model: str | None, stream: bool, prompt_chars: int, doc: dict[str, Any]
    ) -> None:
        # Written out, one per request, as relay.Outcome's (why it is not frozen: there).
        self.model = model
        self.stream = stream
        self.prompt_chars = prompt_chars
        self.doc = doc


def parse_inference_request(body: bytes, prompt_field: str | None) -> InferenceRequest:
    """Validate a chat (`prompt_field="messages"`) or completions (`"prompt"`) body; with no
    `prompt_field`, only `model` and `stream` (the engine judges the rest of the body)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise bad_request("the request body is not valid JSON", "invalid_json") from None
    if not isinstance(doc, dict):
        raise bad_request("the request body must be a JSON object", "invalid_json")
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise bad_request("`model` must be a non-empty string")
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("`stream` must be true or false")
    if prompt_field is None:
        hint = doc.get("input")  # embeddings, responses, pooling: a routing hint at most
        chars = _chars(hint) if isinstance(hint, str | list) else 0
        return InferenceRequest(model=model, stream=bool(stream), prompt_chars=chars, doc=doc)
    prompt = doc.get(prompt_field)
    if prompt is None:
        raise _missing(prompt_field)
    if prompt_field == "messages":
        if not isinstance(prompt, list) or not prompt:
            raise bad_request("`messages` must be a non-empty list of message objects")
        if not all(isinstance(m, dict) for m in prompt):
            raise bad_request("each entry of `messages` must be an object")
    elif not isinstance(prompt, str | list):
        raise bad_request("`prompt` must be a string or a list")
    return InferenceRequest(model=model, stream=bool(stream), prompt_chars=_chars(prompt), doc=doc)


def parse_multipart_request(body: bytes, content_type: bytes) -> InferenceRequest:
    """What routing needs of a multipart/form-data upload (audio): its `model` field. The
    upload itself is the engine's to judge, so a body this cannot read is forwarded as it is."""
    _, _, boundary = content_type.partition(b"boundary=")
    boundary = boundary.split(b";")[0].strip().strip(b'"')
    model = _form_field(body, boundary, b"model") if boundary else None
    if model is not None and not model:
        raise bad_request("`model` must be a non-empty string")
    stream = _form_field(body, boundary, b"stream") if boundary else None
    streamed = stream is not None and stream.lower() == "true"
    return InferenceRequest(model=model, stream=streamed, prompt_chars=0, doc={})


def _form_field(body: bytes, boundary: bytes, name: bytes) -> str | None:
    """The value of a small text field of a multipart body (None: no such field). The parts
    are found with `find`, not split out: the audio beside the field may be megabytes."""
    disposition = b'form-data; name="%b"' % name
    delimiter = b"\r\n--" + boundary
    start = body.find(delimiter[2:])
    while start >= 0:
        head_end = body.find(b"\r\n\r\n", start)
        if head_end < 0:
            return None
        end = body.find(delimiter, head_end)
        head = body[start:head_end].lower()
        if disposition in head and b"filename=" not in head:
            return body[head_end + 4 : end if end >= 0 else len(body)].decode("utf-8", "replace")
        start = end + 2 if end >= 0 else -1
    return None


def _chars(prompt: Any) -> int:
    """Characters of text in a prompt or a message list (a routing hint, not a token count)."""
    if isinstance(prompt, str):
        return len(prompt)
    total = 0
    for item in prompt:
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict) and isinstance(item.get("content"), str):
            total += len(item["content"])
    return total


def _missing(field: str) -> GatewayError:
    return bad_request(f"the request body has no `{field}`", "missing_field")
