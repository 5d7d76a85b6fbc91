"""The tokenizer prompts are measured with: the server's own, or a local copy of it.

Prompt lengths are only exact by the tokenizer that serves the model, so the default asks the
server: vLLM's `POST /tokenize` and `POST /detokenize` on the replica's base URL (a servepilot
gateway proxies them). Most non-vLLM servers do not expose those, so `--tokenizer PATH` loads
the same tokenizer from a local Hugging Face folder instead.

Token ids never include special tokens (`add_special_tokens: false`): a prompt's length is the
length of its text; whatever BOS token the server adds comes on top. `count_chat` counts a
conversation as the chat endpoint does, template included, so chat prompts can be sized to it
(`bench.chat_template`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp

from servepilot.bench.target import server_message
from servepilot.core.errors import ConfigError

_T = TypeVar("_T")
_GATEWAY_HINT = (
    "the target has no vLLM /tokenize endpoint (vLLM and the servepilot gateway have one); "
    "pass --tokenizer PATH with the model's Hugging Face folder"
)


class Tokenizer(Protocol):
    """Text <-> token ids, by the tokenizer of the model under test."""

    @property
    def name(self) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]: ...

    def count_chat(self, messages: Sequence[Mapping[str, str]]) -> int | None:
        """Tokens of `messages` rendered by the chat template for generation (what
        usage.prompt_tokens counts on the chat endpoint); None when the template is unknown."""
        ...


class LocalTokenizer:
    """A Hugging Face tokenizer loaded from a local folder (transformers is imported lazily)."""

    def __init__(self, folder: Path) -> None:
        folder = folder.expanduser()
        if not folder.is_dir():
            raise ConfigError(f"--tokenizer {folder}: no such folder")
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise ConfigError(
                f"--tokenizer {folder}: the transformers package cannot be imported ({exc})",
                hint="pip install transformers, or drop --tokenizer to use the server's /tokenize",
            ) from exc
        try:
            self._tok: Any = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"--tokenizer {folder}: cannot load a tokenizer: {exc}") from exc
        self._name = str(folder)

    @property
    def name(self) -> str:
        return self._name

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_batch([ids])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        encoded = self._tok(list(texts), add_special_tokens=False)["input_ids"]
        return [list(ids) for ids in encoded]

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        if not ids:
            return []
        decoded: list[str] = self._tok.batch_decode([list(one) for one in ids])
        return decoded

    def count_chat(self, messages: Sequence[Mapping[str, str]]) -> int | None:
        if not getattr(self._tok, "chat_template", None):
            return None
        text: str = self._tok.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        # As vLLM does: the rendered text already holds the template's special tokens.
        return len(self.encode(text))


class ServerTokenizer:
    """vLLM's `/tokenize` and `/detokenize`; a batch is sent as concurrent requests."""

    def __init__(
        self, base_url: str, model: str, *, concurrency: int = 8, timeout_s: float = 60.0
    ) -> None:
        # concurrency 8: on a two-core machine 8 to 64 requests in flight tokenized 2,000
        # prompts equally fast (the server is the bottleneck); more only queue in it.
        # Accept the OpenAI base URL too: /tokenize lives at the server root, not under /v1.
        self._base_url = base_url.rstrip("/").removesuffix("/v1")
        self._model = model
        self._concurrency = concurrency
        self._timeout_s = timeout_s

    @property
    def name(self) -> str:
        return f"{self._base_url}/tokenize ({self._model})"

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_batch([ids])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        bodies = [
            {"model": self._model, "prompt": text, "add_special_tokens": False} for text in texts
        ]
        answers = _run_blocking(lambda: self._post_all("/tokenize", bodies))
        return [_tokens_of(answer, self._url("/tokenize")) for answer in answers]

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        bodies = [{"model": self._model, "tokens": list(one)} for one in ids]
        answers = _run_blocking(lambda: self._post_all("/detokenize", bodies))
        return [_text_of(answer, self._url("/detokenize")) for answer in answers]

    def count_chat(self, messages: Sequence[Mapping[str, str]]) -> int | None:
        """vLLM's `/tokenize` with `messages`; None when the target refuses that form."""
        url = self._url("/tokenize")
        body = {"model": self._model, "messages": [dict(m) for m in messages]}
        try:
            answer = _run_blocking(lambda: self._post_all("/tokenize", [body]))[0]
        except TokenizerRefused:
            return None
        return len(_tokens_of(answer, url))

    def _url(self, path: str) -> str:
        return self._base_url + path

    async def _post_all(self, path: str, bodies: list[dict[str, Any]]) -> list[Any]:
        if not bodies:
            return []
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        connector = aiohttp.TCPConnector(limit=self._concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            answers = await asyncio.gather(
                *(self._post(session, path, body) for body in bodies), return_exceptions=True
            )
        # Every request is let finish, so a failure leaves no task running on a closed session.
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return answers

    async def _post(self, session: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> Any:
        url = self._url(path)
        try:
            async with session.post(url, json=body) as response:
                text = await response.text()
                if response.status != 200:
                    raise _refused(url, response.status, text, body.get("model"))
                return await response.json(content_type=None)
        except aiohttp.ClientConnectorError as exc:
            raise ConfigError(
                f"--url: cannot connect to {url} ({exc.os_error})",
                hint="is the server running on that address and port?",
            ) from exc
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ConfigError(
                f"--url: POST {url} failed: {type(exc).__name__}: {exc}", hint=_GATEWAY_HINT
            ) from exc


class TokenizerRefused(ConfigError):
    """The target answered a tokenizer call with an error status."""


def _refused(url: str, status: int, text: str, model: object) -> TokenizerRefused:
    """The server's own reason first: a gateway or vLLM that does not serve `model` says so in
    an OpenAI-shaped body, which matters more than a missing /tokenize."""
    message = server_message(text)
    if status in (400, 404) and isinstance(model, str) and "model" in message.lower():
        return TokenizerRefused(
            f"--url: POST {url} answered {status}: {message}",
            hint=f"the target does not serve --model {model!r}: see its GET /v1/models",
        )
    return TokenizerRefused(f"--url: POST {url} answered {status}: {message}", hint=_GATEWAY_HINT)


def open_tokenizer(url: str, model: str, tokenizer_path: Path | None) -> Tokenizer:
    """The local tokenizer when `--tokenizer` was given, else the server's."""
    if tokenizer_path is not None:
        return LocalTokenizer(tokenizer_path)
    return ServerTokenizer(url, model)


def _tokens_of(answer: Any, url: str) -> list[int]:
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ConfigError(
            f"--url: POST {url} did not answer with a token list: {str(answer)[:200]}",
            hint=_GATEWAY_HINT,
        )
    return tokens


def _text_of(answer: Any, url: str) -> str:
    text = answer.get("prompt") if isinstance(answer, dict) else None
    if not isinstance(text, str):
        raise ConfigError(
            f"--url: POST {url} did not answer with a prompt text: {str(answer)[:200]}",
            hint=_GATEWAY_HINT,
        )
    return text


def _run_blocking(make: Callable[[], Awaitable[_T]]) -> _T:
    """Runs a coroutine to completion from sync code, even when called inside an event loop."""

    async def _main() -> _T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_main())
    # Inside a running loop asyncio.run is refused; a private loop on a worker thread is not.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _main()).result()
