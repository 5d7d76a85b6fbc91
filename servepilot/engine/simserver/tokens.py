"""Token counts for the simulated replica: the model's real tokenizer, or an approximation.

The replica model needs only how many tokens a prompt has (and, for prefix caching, which
prompts share their first blocks), but clients compare those counts with vLLM's, so:

- `HfTokenizer` reads a Hugging Face folder's tokenizer.json with the `tokenizers` library
  and renders its chat template as transformers' `apply_chat_template` does
  (`engine.chat_template`): usage.prompt_tokens is
  what vLLM reports for the same request (tests/unit/test_sim_server.py checks it against
  transformers). Not transformers itself: importing it takes seconds of CPU, and dozens of
  simulated replicas start on one machine.
- `ApproxTokenizer`, when no folder is given: deterministic, about one token per 4
  characters of English (a word piece of up to 4 letters with its leading space, a digit, a
  punctuation mark, or a run of whitespace). Ids encode the piece's UTF-8 bytes, so any
  replica decodes any other's ids and `/tokenize` + `/detokenize` round-trip (what bench's
  exact-length prompts need). Chat messages are rendered as
  `<|im_start|>{role}\\n{content}<|im_end|>\\n` plus `<|im_start|>assistant\\n` and counted
  the same way.

Generated text is filler: one word of `FILLER` per token, in turn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from servepilot.core.errors import ConfigError
from servepilot.engine.chat_template import ChatTemplate

# Each word with its leading space is one token of SmolLM2's tokenizer, of the approximation
# and of the usual English BPE vocabularies: a generated text re-tokenizes to as many tokens
# as were generated (what a continuation on another replica counts on).
FILLER = ("we", "sat", "by", "the", "sea", "and", "saw", "a", "new", "day", "come", "in")
_FILLER_TOKENS = tuple(" " + word for word in FILLER)

# A piece: up to 4 word characters with one leading space, one digit, one other symbol with
# its leading space, or whitespace.
_PIECE = re.compile(r" ?[^\W\d_]{1,4}| ?\d| ?[^\w\s]|_| ?_|\s+")
_ID_MARK = b"\x01"  # kept in front of the bytes so a leading zero byte survives int()
_MAX_PIECE_BYTES = 7  # ids stay below 2**64


def filler_token(index: int) -> str:
    """The text of the `index`-th generated token (0-based)."""
    return _FILLER_TOKENS[index % len(_FILLER_TOKENS)]


def filler_text(count: int) -> str:
    return "".join(filler_token(i) for i in range(count))


class PromptTokenizer(Protocol):
    name: str

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The ids of a conversation rendered for generation (the assistant's turn next)."""
        ...


def message_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list joined by newlines
    (as vLLM passes them to a string chat template). ValueError for anything else."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise ValueError("only text content parts are supported by the simulator")
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError("a text content part needs a `text` string")
            parts.append(text)
        return "\n".join(parts)
    raise ValueError("`content` must be a string or a list of text parts")


class ApproxTokenizer:
    """The deterministic approximation described in the module docstring."""

    name = "approximate (about 4 characters per token)"

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for piece in _PIECE.findall(text):
            raw = piece.encode("utf-8")
            if len(raw) <= _MAX_PIECE_BYTES:
                ids.append(int.from_bytes(_ID_MARK + raw, "big"))
            else:  # long whitespace runs, non-Latin letters: one id per character
                ids.extend(int.from_bytes(_ID_MARK + c.encode("utf-8"), "big") for c in piece)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out = bytearray()
        for token in ids:
            if token <= 0:
                continue
            raw = token.to_bytes((token.bit_length() + 7) // 8, "big")
            out += raw[1:] if raw[:1] == _ID_MARK else raw
        return out.decode("utf-8", errors="replace")

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        text = "".join(
            f"<|im_start|>{m.get('role', '')}\n{message_text(m.get('content'))}<|im_end|>\n"
            for m in messages
        )
        return self.encode(text + "<|im_start|>assistant\n")


class HfTokenizer:
    """A Hugging Face folder's tokenizer.json and chat template (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - installed with vLLM
            raise ConfigError(
                f"--tokenizer {folder}: the `tokenizers` package cannot be imported ({exc})",
                hint="drop --tokenizer to count tokens approximately",
            ) from None
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(f"--tokenizer {folder}: no tokenizer.json in that folder")
        self.name = str(folder)
        self._tok = Tokenizer.from_file(str(file))
        self._template = ChatTemplate.from_folder(folder, where=f"--tokenizer {folder}")

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tok.decode(list(ids), skip_special_tokens=False)
        return text

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        if self._template is None:
            raise ValueError(f"{self.name} has no chat template; use /v1/completions")
        conversation = [{**m, "content": message_text(m.get("content"))} for m in messages]
        # vLLM tokenizes a rendered chat without adding special tokens: the template has them.
        return self.encode(self._template.render(conversation), add_special_tokens=False)


def load_tokenizer(folder: Path | None) -> PromptTokenizer:
    if folder is None:
        return ApproxTokenizer()
    if not folder.is_dir():
        raise ConfigError(f"--tokenizer {folder}: no such folder")
    return HfTokenizer(folder)
