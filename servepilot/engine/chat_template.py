"""A model's chat template, rendered as transformers' `apply_chat_template` renders it (which
vLLM calls to turn a chat request into its prompt), without transformers itself: importing it
imports torch, 13 s of CPU and 420 MB on this project's test machine, where this module and
the `tokenizers` library take 0.3 s and 65 MB. The gateway's exact prefix index and the
simulated replica both render prompts with it.

From a Hugging Face folder: chat_template.jinja, else tokenizer_config.json's `chat_template`
(the default of named ones); the special tokens a template may name (`bos_token`, ...), from
tokenizer_config.json, else special_tokens_map.json. Compiled in transformers' environment
(utils/chat_template_utils.py): a sandbox with trim_blocks, lstrip_blocks and loop controls;
`tojson` without HTML escaping; `raise_exception` and `strftime_now`; the `{% generation %}`
tag, which only marks the text it holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from servepilot.core.errors import ConfigError

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")  # fmt: skip
"""The special tokens transformers hands a template by name (its `special_tokens_map`)."""


class ChatTemplate:
    """One compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: Mapping[str, str], where: str) -> None:
        self._template = _compile(source, where)
        self._special = dict(special_tokens)

    @classmethod
    def from_folder(cls, folder: Path, where: str | None = None) -> ChatTemplate | None:
        """The folder's template; None when it has none (a base model: completions only)."""
        config = read_json(folder / "tokenizer_config.json")
        source = _source(folder, config)
        if source is None:
            return None
        specials = read_json(folder / "special_tokens_map.json")
        tokens = {}
        for key in SPECIAL_TOKENS:
            text = token_text(config.get(key)) or token_text(specials.get(key))
            if text is not None:
                tokens[key] = text
        return cls(source, tokens, where or str(folder))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text, as `apply_chat_template(messages, tools=tools, tokenize=False,
        add_generation_prompt=...)` renders it. A template's own refusal (`raise_exception`)
        raises ValueError."""
        import jinja2

        try:
            text: str = self._template.render(
                messages=list(messages),
                tools=None if tools is None else list(tools),
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._special,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(str(exc)) from None
        return text


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; {} where there is none. A file that is not JSON: ConfigError."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    return doc if isinstance(doc, dict) else {}


def token_text(value: Any) -> str | None:
    """A special token as tokenizer files write it: its text, or an AddedToken's `content`."""
    if isinstance(value, dict):  # AddedToken as saved by older transformers
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _source(folder: Path, config: Mapping[str, Any]) -> str | None:
    """transformers' order: chat_template.jinja, then tokenizer_config.json's field."""
    file = folder / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile(source: str, where: str) -> Any:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's text
        with it (for training masks); rendered, it is its body."""

        tags = {"generation"}  # noqa: RUF012 - jinja's Extension declares it a plain set

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            text: str = caller()
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)  # fmt: skip

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"{where}: the chat template does not parse: {exc}") from None
