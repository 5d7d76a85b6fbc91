"""The gateway's tokenizer edge: a prompt's token ids, as vLLM will see them, computed once.

The exact prefix index (routing.kv_index) is keyed by token ids. Chat prompts are rendered by
the model's chat template (as vLLM renders them) and tokenised without adding special tokens;
completion prompts are tokenised with them; token-id prompts are taken as they are.

A conversation's turns repeat its history, so tokenising every prompt whole would cost the
gateway one full tokenisation per turn. Special tokens (a chat template's `<|im_start|>` and
`<|im_end|>`) are split out of the text before the rest is tokenised, so the pieces between
them tokenise on their own to the same ids as inside the whole text; a bounded LRU keeps each
piece's ids, and a new turn tokenises only the pieces it has not seen. Tokenizers whose added
tokens strip the whitespace around them, or whose normaliser could move those boundaries, are
tokenised whole instead.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.core.errors import ServepilotError
from servepilot.engine.chat_template import ChatTemplate
from servepilot.routing.kv_index import (
    BlockHashing,
    chained_hashes,
    prompt_block_hashes,
    root_hash,
)

_LONG_CHARS = 4096
"""Text from this long is tokenised with the GIL released (`PromptTokenizer._encode`)."""
INLINE_NEW_CHARS = 4000
"""A chat prompt whose pieces the chains lack less text than this of (a conversation's new
turn: up to about 1,000 tokens) is keyed on the event loop. The hand-off to the tokenizer's
thread and back costs more than that: about 0.11 ms a request on this 2-core machine, where
keying a turn seen before takes 0.06 ms (`benchmarks/bench_prompt_tokens.py`)."""


class PieceCache:
    """Token ids of text pieces, least recently used forgotten first, bounded in characters."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._chars = 0
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, piece: str) -> list[int] | None:
        ids = self._ids.get(piece)
        if ids is not None:
            self._ids.move_to_end(piece)
            self.hits += 1
        return ids

    def put(self, piece: str, ids: list[int]) -> None:
        self.misses += 1
        if len(piece) > self.max_chars:
            return
        self._ids[piece] = ids
        self._chars += len(piece)
        while self._chars > self.max_chars:
            old, _ = self._ids.popitem(last=False)
            self._chars -= len(old)


class PromptTokenizer:
    """Token ids of request bodies by the served model's tokenizer (a Hugging Face folder)."""

    def __init__(self, folder: str | Path, cache_chars: int = 4_000_000) -> None:
        """The folder's tokenizer.json and chat template, read without transformers (whose
        import, with torch's, took 13 s of CPU and 420 MB; `engine.chat_template`). Raises
        OSError when the folder has no tokenizer.json, ValueError when it is not one or its
        template does not parse."""
        from tokenizers import Tokenizer  # only gateways with an index load it

        folder = Path(folder)
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such file (a Hugging Face tokenizer folder?)")
        try:
            backend = Tokenizer.from_file(str(file))
            self._template = ChatTemplate.from_folder(folder)
        except ServepilotError as exc:
            raise ValueError(str(exc)) from None
        except Exception as exc:  # the tokenizers library raises its own plain Exception
            raise ValueError(
                f"{file}: not a tokenizer the tokenizers library reads ({exc})"
            ) from None
        self._backend = backend
        self._fast = hasattr(backend, "encode_batch_fast")
        spec = json.loads(backend.to_str())
        added = spec.get("added_tokens") or []
        self._special = {t["content"]: int(t["id"]) for t in added}
        splittable = spec.get("normalizer") is None and not any(
            t.get("lstrip") or t.get("rstrip") for t in added
        )
        self._split: re.Pattern[str] | None = None
        if splittable and self._special:
            # Longest first, so a token that contains another is matched whole.
            names = sorted(self._special, key=len, reverse=True)
            self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")")
        self._pieces = PieceCache(cache_chars)

    @property
    def pieces(self) -> PieceCache:
        return self._pieces

    def rendered(self, messages: Sequence[Any], tools: Any = None) -> str | None:
        """The chat prompt's text as vLLM renders it (the folder's chat template); None for
        multimodal parts, and where the folder has no template."""
        return self._rendered(messages, tools)

    def body_ids(self, doc: Mapping[str, Any]) -> list[int] | None:
        """The prompt's ids for a chat or completions body; None for what it cannot render
        (multimodal parts, a list of prompts, a template error)."""
        messages = doc.get("messages")
        try:
            if isinstance(messages, list):
                return self.chat_ids(messages, doc.get("tools"))
            prompt = doc.get("prompt")
            if isinstance(prompt, str):
                return self.text_ids(prompt, add_special_tokens=True)
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                return list(prompt)
        except Exception:  # a body the template refuses costs exactness, never the request
            return None
        return None

    def chat_ids(self, messages: Sequence[Any], tools: Any = None) -> list[int] | None:
        text = self._rendered(messages, tools)
        return None if text is None else self.text_ids(text, add_special_tokens=False)

    def chat_pieces(self, doc: Mapping[str, Any]) -> list[str] | None:
        """A chat body's rendered prompt cut at its special tokens, each piece tokenising on
        its own to the ids it has in the whole (`piece_ids`); None for other bodies, for what
        the template cannot render, and where the tokenizer's pieces do not tokenise apart."""
        messages = doc.get("messages")
        if self._split is None or not isinstance(messages, list):
            return None
        try:
            text = self._rendered(messages, doc.get("tools"))
        except Exception:  # a body the template refuses costs exactness, never the request
            return None
        return None if text is None else [piece for piece in self._split.split(text) if piece]

    def piece_ids(self, piece: str) -> list[int]:
        """A piece's ids: a special token's own, else from the cache or tokenised now."""
        token = self._special.get(piece)
        if token is not None:
            return [token]
        cached = self._pieces.get(piece)
        if cached is None:
            cached = list(self._encode(piece, add_special_tokens=False).ids)
            self._pieces.put(piece, cached)
        return cached

    def _rendered(self, messages: Sequence[Any], tools: Any) -> str | None:
        if any(not isinstance(m.get("content", ""), str | None) for m in messages):
            return None  # multimodal parts: vLLM's placeholders are not ours to render
        if self._template is None:
            return None
        return self._template.render(messages, tools=tools)

    def text_ids(self, text: str, *, add_special_tokens: bool) -> list[int]:
        if add_special_tokens or self._split is None:
            return list(self._encode(text, add_special_tokens=add_special_tokens).ids)
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece:
                ids.extend(self.piece_ids(piece))
        return ids

    def _encode(self, text: str, *, add_special_tokens: bool) -> Any:
        # `encode_batch_fast` leaves out the character offsets, which the index never reads
        # (98 against 118-126 us for 88 tokens here), and lets the GIL go, where `encode`
        # holds it for all of it (90 ms at 50k tokens: the event loop would stand still
        # though this runs on another thread). Tokenizers before 0.20 lack it.
        if self._fast:
            return self._backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]
        if len(text) < _LONG_CHARS:
            return self._backend.encode(text, add_special_tokens=add_special_tokens)
        return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]

    def whole_ids(self, text: str) -> list[int]:
        """The text tokenised whole, without the piece cache (what the cache must equal)."""
        return list(self._encode(text, add_special_tokens=False).ids)


@dataclass(frozen=True, slots=True)
class PromptKeys:
    """What the exact index needs of a prompt: its length and its blocks' hashes."""

    tokens: int
    block_hashes: tuple[bytes, ...]


class _Link:
    """One piece of a prompt after the pieces before it: what it adds to the prompt."""

    __slots__ = ("digests", "last", "next", "tail", "tokens")

    def __init__(
        self, tokens: int, digests: tuple[bytes, ...], tail: tuple[int, ...], last: bytes
    ) -> None:
        self.next: dict[str, _Link] = {}
        self.tokens = tokens
        """The prompt's tokens up to the end of this piece."""
        self.digests = digests
        """The digests of the blocks that end within this piece."""
        self.tail = tail
        """The ids after the last full block, waiting for the next piece to fill it."""
        self.last = last
        """The last full block's digest: the parent of the next block."""


class PieceChains:
    """Prompts' block hashes by their pieces, kept as a tree: the prompts that begin with the
    same pieces (a conversation's turns, a shared system prompt) share those pieces' tokens
    and block digests, so a new turn tokenises and hashes only what it adds. Bounded by the
    characters of the pieces it holds: past `max_chars` it starts again from nothing."""

    def __init__(self, hashing: BlockHashing, max_chars: int) -> None:
        self._hashing = hashing
        self._max_chars = max_chars
        self._chars = 0
        self._root = _Link(0, (), (), root_hash(hashing))

    def new_chars(self, pieces: Sequence[str]) -> int:
        """The characters of `pieces` that `keys` would tokenise: those past the longest run
        of them from the start that the chains hold."""
        if self._chars > self._max_chars:  # `keys` starts again from nothing
            return sum(len(piece) for piece in pieces)
        link: _Link | None = self._root
        new = 0
        for piece in pieces:
            link = link.next.get(piece) if link is not None else None
            if link is None:
                new += len(piece)
        return new

    def keys(self, pieces: Sequence[str], ids_of: Callable[[str], list[int]]) -> PromptKeys:
        if self._chars > self._max_chars:
            self._chars = 0
            self._root = _Link(0, (), (), self._root.last)
        link = self._root
        digests: list[bytes] = []
        for piece in pieces:
            after = link.next.get(piece)
            if after is None:
                after = link.next[piece] = self._grow(link, ids_of(piece))
                self._chars += len(piece)
            digests += after.digests
            link = after
        # vLLM reuses at most all but the last token: a last full block is not hashed.
        usable = max(0, (link.tokens - 1) // self._hashing.block_size)
        return PromptKeys(link.tokens, tuple(digests[:usable]))

    def _grow(self, link: _Link, ids: list[int]) -> _Link:
        pending = [*link.tail, *ids]
        full = len(pending) // self._hashing.block_size * self._hashing.block_size
        digests = chained_hashes(pending[:full], self._hashing, link.last)
        last = digests[-1] if digests else link.last
        return _Link(link.tokens + len(ids), tuple(digests), tuple(pending[full:]), last)


class PromptBlocks:
    """A request body's token count and vLLM block hashes, by the tokenizer and hashing the
    replicas use.

    The gateway asks through `keys_async`. A new 32k-token prompt takes about 125 ms to
    tokenise, which on the event loop would stall every stream the gateway relays: such
    work runs on one thread of its own. A conversation's next turn, which adds little to
    what the chains hold (`INLINE_NEW_CHARS`), is keyed on the loop, and only while the
    thread has nothing in hand: the tokenizer, its piece cache and the chains are then
    touched by one thread at a time, with no lock. `close` stops the thread (the gateway's
    stop)."""

    def __init__(self, tokenizer: PromptTokenizer, hashing: BlockHashing) -> None:
        self.tokenizer = tokenizer
        self.hashing = hashing
        self.chains = PieceChains(hashing, tokenizer.pieces.max_chars)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="servepilot-tokens")
        self._in_thread = 0
        """Calls handed to the thread and not back yet (while any, the loop keys none)."""

    async def keys_async(self, doc: Mapping[str, Any]) -> PromptKeys | None:
        pieces = None
        if not self._in_thread:
            pieces = self.tokenizer.chat_pieces(doc)
            if pieces is not None and self.chains.new_chars(pieces) < INLINE_NEW_CHARS:
                return self.chains.keys(pieces, self.tokenizer.piece_ids)
        self._in_thread += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._worker, self._keys, doc, pieces)
        finally:
            self._in_thread -= 1

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def keys(self, doc: Mapping[str, Any]) -> PromptKeys | None:
        return self._keys(doc, None)

    def _keys(self, doc: Mapping[str, Any], pieces: list[str] | None) -> PromptKeys | None:
        """`pieces`: the chat prompt's, where the caller has them already."""
        if pieces is None:
            pieces = self.tokenizer.chat_pieces(doc)
        if pieces is not None:
            return self.chains.keys(pieces, self.tokenizer.piece_ids)
        ids = self.tokenizer.body_ids(doc)
        if ids is None:
            return None
        return PromptKeys(len(ids), tuple(prompt_block_hashes(ids, self.hashing)))
