"""The text a request's prefix is made of, and chained hashes of its leading blocks.

Both run on the gateway's hot path for every request routed by a prefix-aware policy, so they
stay allocation-light: one join for the text, one slice and one small tuple hash per block.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

# Separators that cannot appear in ordinary text keep "ab" + "c" from rendering like "a" + "bc"
# across message or field boundaries, so two different histories never render alike.
_FIELD = "\x1f"
_MESSAGE = "\x1e"
_PART = "\x1d"
# Characters per token id in the rendering of a token-id prompt (`array("I")` items).
_TOKEN_CHARS = array("I").itemsize


def prompt_text(body: Mapping[str, Any], max_chars: int | None = None) -> str:
    """The prompt of an OpenAI-style request body as one string, for prefix hashing.

    Chat: every message in order (role, then content; the text of multi-part content, with a
    marker standing for each non-text part), so a conversation's history is part of its prefix.
    Completions: `prompt` as a string, a list of strings, or token ids (four characters per
    id). Never raises on an odd shape; it renders what it can. `max_chars` stops early once
    that many characters are rendered (only the leading blocks get hashed, so a long history
    need not be joined whole).
    """
    try:
        messages = body.get("messages")
        if isinstance(messages, list):
            pieces = _chat_pieces(messages, max_chars)
        else:
            pieces = _prompt_pieces(body.get("prompt"), max_chars)
    except Exception:  # a hostile body must cost affinity, never the request
        return ""
    text = "".join(pieces)
    return text if max_chars is None else text[:max_chars]


def prefix_hashes(text: str, block_chars: int, max_blocks: int) -> tuple[int, ...]:
    """Chained hashes of the leading full blocks: block i's hash covers blocks 0..i.

    A trailing partial block is not hashed, as vLLM caches full blocks only. The built-in
    `hash` is salted per process, which is fine: the tables these hashes index live in the
    process that computed them.
    """
    if block_chars <= 0 or max_blocks <= 0:
        return ()
    end = min(len(text) // block_chars, max_blocks) * block_chars
    hashes: list[int] = []
    append = hashes.append
    chained = 0
    for start in range(0, end, block_chars):
        chained = hash((chained, text[start : start + block_chars]))
        append(chained)
    return tuple(hashes)


def _chat_pieces(messages: list[Any], max_chars: int | None) -> list[str]:
    pieces: list[str] = []
    size = 0
    for message in messages:
        if max_chars is not None and size >= max_chars:
            break
        piece = _message_text(message)
        pieces.append(piece)
        size += len(piece)
    return pieces


def _message_text(message: Any) -> str:
    # `dict`, not `Mapping`: bodies come from JSON, and an ABC isinstance check per message
    # and part would cost more than the rest of the rendering.
    if not isinstance(message, dict):
        return _scalar(message) + _MESSAGE
    content = message.get("content")
    text = content if isinstance(content, str) else _content_text(content)
    tool_calls = message.get("tool_calls")
    if tool_calls:
        text += _tool_calls_text(tool_calls)
    return f"{_scalar(message.get('role'))}{_FIELD}{text}{_MESSAGE}"


def _content_text(content: Any) -> str:
    if not isinstance(content, list):
        return _scalar(content)
    pieces: list[str] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            pieces.append(_scalar(part.get("text")))
        elif isinstance(part, str):
            pieces.append(part)
        else:
            # An image or audio part: its bytes are not worth hashing here, but its position
            # is, so text after it still lines up the same way in every request.
            kind = part.get("type") if isinstance(part, dict) else None
            pieces.append(f"{_PART}{_scalar(kind)}{_PART}")
    return "".join(pieces)


def _tool_calls_text(tool_calls: Any) -> str:
    # Assistant turns that called tools often have no content; their calls are what the chat
    # template renders in their place, so they belong to the history's prefix.
    if not isinstance(tool_calls, list):
        return ""
    pieces: list[str] = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            name, arguments = function.get("name"), function.get("arguments")
            pieces.append(f"{_FIELD}{_scalar(name)}{_FIELD}{_scalar(arguments)}")
    return "".join(pieces)


def _prompt_pieces(prompt: Any, max_chars: int | None) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list):
        return [_scalar(prompt)]
    if prompt and isinstance(prompt[0], int):
        return [_token_ids(prompt, max_chars)]
    pieces: list[str] = []
    size = 0
    for item in prompt:
        if max_chars is not None and size >= max_chars:
            break
        piece = _token_ids(item, max_chars) if isinstance(item, list) else _scalar(item)
        pieces.append(piece)
        pieces.append(_MESSAGE)
        size += len(piece) + 1
    return pieces


def _token_ids(ids: list[Any], max_chars: int | None) -> str:
    """Token ids as text: each id's four bytes as four characters.

    Packing in C is a hundred times cheaper than formatting every id in decimal, and a
    run of equal leading ids still renders as equal leading text. Lists that do not pack
    (negative or huge ids, other items) fall back to a decimal rendering.
    """
    if max_chars is not None:
        ids = ids[: max_chars // _TOKEN_CHARS + 1]
    try:
        return array("I", ids).tobytes().decode("latin-1")
    except (TypeError, OverflowError):
        return ",".join(map(_scalar, ids))


def _scalar(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    return type(value).__name__
