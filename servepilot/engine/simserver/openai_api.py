"""vLLM's OpenAI API for the simulated replica: request checks and response bytes.

What a request asks is reduced to prompt token ids and a number of tokens to generate. As
with vLLM 0.32 (entrypoints/serve/utils/api_utils.py get_max_tokens, renderers/params.py):
- a prompt longer than max_model_len is a 400 ("This model's maximum context length is ...");
- max_tokens above max_model_len is a 400; otherwise the output is
  min(max_tokens, max_model_len - prompt tokens), max_tokens defaulting to 16 on
  /v1/completions and to the rest of the context on /v1/chat/completions;
- there is no EOS: every request generates that many tokens (as with `ignore_eos`), so
  `min_tokens` and `ignore_eos` change nothing and every finish_reason is "length".
Errors are vLLM's ErrorResponse: {"error": {"message", "type", "param", "code": <int>}}.

Streamed answers have vLLM's shape: a chat stream sends the assistant role with the first
token, then one chunk per token, the last with finish_reason "length", then (with
stream_options.include_usage) a chunk with the usage and no choices, then `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from servepilot.engine.simserver.tokens import FILLER, PromptTokenizer, filler_text

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
_MAX_TOKEN_ID = 2**63
# Each generated token's text as a JSON string, encoded once: a stream writes one per step.
_TOKEN_JSON = tuple(json.dumps(" " + word).encode() for word in FILLER)


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, error_type: str = "BadRequestError", param: str | None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param

    def body(self) -> bytes:
        error = {
            "message": self.message,
            "type": self.error_type,
            "param": self.param,
            "code": self.status,
        }
        return json.dumps({"error": error}).encode()


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True, slots=True)
class Job:
    """One generation request, checked."""

    chat: bool
    prompt_ids: list[int]
    output_tokens: int
    stream: bool
    include_usage: bool


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise bad_request("the request body must be a JSON object")
    return doc


def check_model(doc: dict[str, Any], served_name: str) -> None:
    model = doc.get("model")
    if model is not None and model != served_name:
        raise ApiError(
            404, f"The model `{model}` does not exist.", error_type="NotFoundError", param="model"
        )


def parse_job(
    doc: dict[str, Any], *, chat: bool, tokenizer: PromptTokenizer, max_model_len: int
) -> Job:
    if doc.get("n", 1) != 1:
        raise bad_request("the simulated replica supports only n = 1", "n")
    prompt_ids = _chat_ids(doc, tokenizer) if chat else _completion_ids(doc, tokenizer)
    asked = doc.get("max_completion_tokens") if chat else None
    if asked is None:
        asked = doc.get("max_tokens")
    if asked is None and not chat:
        asked = COMPLETIONS_DEFAULT_MAX_TOKENS
    if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
        raise bad_request(f"max_tokens must be at least 1, got {asked}.", "max_tokens")
    if asked is not None and asked > max_model_len:
        raise bad_request(
            f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
        )
    count = len(prompt_ids)
    if count >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {count} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
        )
    room = max_model_len - count
    stream = bool(doc.get("stream", False))
    options = doc.get("stream_options")
    include_usage = stream and isinstance(options, dict) and bool(options.get("include_usage"))
    return Job(chat, prompt_ids, min(asked or room, room), stream, include_usage)


def _chat_ids(doc: dict[str, Any], tokenizer: PromptTokenizer) -> list[int]:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty list", "messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise bad_request("each message needs a `role` string", "messages")
    try:
        return tokenizer.chat(messages)
    except ValueError as exc:
        raise bad_request(str(exc), "messages") from None


def _completion_ids(doc: dict[str, Any], tokenizer: PromptTokenizer) -> list[int]:
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    elif isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        ids = list(prompt)
    else:
        raise bad_request(
            "`prompt` must be a string or a list of token ids (one prompt per request)", "prompt"
        )
    if not ids:
        raise bad_request("the prompt is empty", "prompt")
    # vLLM refuses ids outside its vocabulary; no vocabulary here, but the prefix map keeps
    # a prompt's ids as 64-bit ints (prefixmap.py).
    lowest, highest = min(ids), max(ids)
    if lowest < 0 or highest >= _MAX_TOKEN_ID:
        out = lowest if lowest < 0 else highest
        raise bad_request(f"Token id {out} is out of vocabulary", "prompt")
    return ids


# ---- responses ---------------------------------------------------------------------------


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class StreamFormat:
    """The SSE events of one streamed answer, as bytes; the per-token event is built from
    a preformatted head and tail around the token's text."""

    def __init__(self, job: Job, served_name: str) -> None:
        self.job = job
        kind = "chat.completion.chunk" if job.chat else "text_completion"
        prefix = "chatcmpl-" if job.chat else "cmpl-"
        self._envelope = {
            "id": prefix + uuid.uuid4().hex,
            "object": kind,
            "created": int(time.time()),
            "model": served_name,
        }
        head = _dumps({**self._envelope, "choices": []})[: -len(b"[]}")]
        if job.chat:
            self._head = b"data: " + head + b'[{"index":0,"delta":{"content":'
            self._tail = b'},"logprobs":null,"finish_reason":null}]}\n\n'
            self._last_tail = b'},"logprobs":null,"finish_reason":"length"}]}\n\n'
        else:
            self._head = b"data: " + head + b'[{"index":0,"text":'
            self._tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self._last_tail = b',"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'

    def token(self, index: int) -> bytes:
        """The event of token `index`; the first also carries the chat role event."""
        last = index == self.job.output_tokens - 1
        text = _TOKEN_JSON[index % len(_TOKEN_JSON)]
        event = self._head + text + (self._last_tail if last else self._tail)
        if index == 0 and self.job.chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}  # fmt: skip
            event = b"data: " + _dumps({**self._envelope, "choices": [role]}) + b"\n\n" + event
        return event

    def end(self) -> bytes:
        out = b""
        if self.job.include_usage:
            out = b"data: " + _dumps({**self._envelope, "choices": [], "usage": usage(self.job)})
            out += b"\n\n"
        return out + b"data: [DONE]\n\n"


def usage(job: Job) -> dict[str, int]:
    prompt = len(job.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + job.output_tokens,
        "completion_tokens": job.output_tokens,
    }


def whole_answer(job: Job, served_name: str) -> bytes:
    """The non-streamed answer, once every token is generated."""
    text = filler_text(job.output_tokens)
    if job.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        kind, prefix = "chat.completion", "chatcmpl-"
    else:
        choice = {
            "index": 0, "text": text, "logprobs": None, "finish_reason": "length",
            "stop_reason": None,
        }  # fmt: skip
        kind, prefix = "text_completion", "cmpl-"
    doc = {
        "id": prefix + uuid.uuid4().hex,
        "object": kind,
        "created": int(time.time()),
        "model": served_name,
        "choices": [choice],
        "usage": usage(job),
    }
    return _dumps(doc)
