"""Token counts for the simulated replica: the model's real tokenizer, or an approximation.

The replica model needs only how many tokens a prompt has (and, for prefix caching, which
prompts share their first blocks), but clients compare those counts with vLLM's, so:

- `HfTokenizer` reads a Hugging Face folder's tokenizer.json with the `tokenizers` library
  and renders its chat template with jinja2 exactly as transformers' `apply_chat_template`
  does (same sandbox, trim_blocks/lstrip_blocks, special tokens): usage.prompt_tokens is
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

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from servepilot.core.errors import ConfigError

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
        config = _read_json(folder / "tokenizer_config.json")
        self._specials = {
            key: _token_text(config.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        self._template = _compile_template(_chat_template(folder, config), folder)

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
        text = self._template.render(
            messages=conversation,
            add_generation_prompt=True,
            tools=None,
            documents=None,
            **{k: v for k, v in self._specials.items() if v is not None},
        )
        # vLLM tokenizes a rendered chat without adding special tokens: the template has them.
        return self.encode(text, add_special_tokens=False)


def load_tokenizer(folder: Path | None) -> PromptTokenizer:
    if folder is None:
        return ApproxTokenizer()
    if not folder.is_dir():
        raise ConfigError(f"--tokenizer {folder}: no such folder")
    return HfTokenizer(folder)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    return doc if isinstance(doc, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken as saved by older transformers
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """transformers' order: chat_template.jinja, then tokenizer_config.json's field."""
    file = folder / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile_template(source: str | None, folder: Path) -> Any:
    if source is None:
        return None
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    def tojson(value: Any, indent: int | None = None, **_: Any) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    # transformers' environment (utils/chat_template_utils.py): same options and helpers.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise ConfigError(
            f"--tokenizer {folder}: the chat template does not parse: {exc}"
        ) from None
