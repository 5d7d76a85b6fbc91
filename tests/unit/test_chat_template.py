"""Chat templates rendered without transformers, against transformers' own rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servepilot.core.errors import ConfigError
from servepilot.engine.chat_template import ChatTemplate
from servepilot.engine.model_source import embedded_model_dir

# The features transformers' environment adds to jinja's: a named template of several, the
# special tokens by name, tools through its tojson (no HTML escaping, its options), the
# generation tag, loop controls, raise_exception.
TEMPLATE = (
    "{{ bos_token }}{% if tools %}Tools: {{ tools | tojson(indent=2, sort_keys=True) }}\n"
    "{% endif %}{% for m in messages %}{% if m.role == 'bad' %}"
    "{{ raise_exception('no bad roles: ' + m.content) }}{% endif %}"
    "{% if loop.index > 5 %}{% break %}{% endif %}"
    "<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief & <kind>."},
    {"role": "user", "content": "Is 2 < 3? «yes»"},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "Weather?"},
]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"name": "weather", "description": "Météo <now>", "parameters": CITY}
TOOLS = [{"type": "function", "function": WEATHER}]


def _folder(tmp_path: Path, template: Any) -> Path:
    config = {"chat_template": template, "bos_token": "<s>",
              "eos_token": {"content": "</s>", "lstrip": False}}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_template_renders_as_transformers_renders_it(tmp_path: Path) -> None:
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    named = [{"name": "tool_use", "template": "unused"}, {"name": "default", "template": TEMPLATE}]
    ours = ChatTemplate.from_folder(_folder(tmp_path, named))
    assert ours is not None
    for tools in (None, TOOLS):
        for generation_prompt in (True, False):
            rendered, _ = utils.render_jinja_template(
                conversations=[MESSAGES], tools=tools, chat_template=TEMPLATE,
                add_generation_prompt=generation_prompt, bos_token="<s>", eos_token="</s>",
            )  # fmt: skip
            text = ours.render(MESSAGES, tools=tools, add_generation_prompt=generation_prompt)
            assert text == rendered[0]
    assert ours.render(MESSAGES).startswith("<s><system>Be brief & <kind>.</s>\n<user>Is 2 < 3?")
    assert "Météo <now>" in ours.render(MESSAGES, tools=TOOLS)


def test_the_embedded_models_template_as_transformers_renders_it() -> None:
    transformers = pytest.importorskip("transformers")
    folder = embedded_model_dir()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = ChatTemplate.from_folder(folder)
    assert ours is not None
    for messages in (MESSAGES, MESSAGES[1:2], [{"role": "user", "content": ""}]):
        for generation_prompt in (True, False):
            expected = hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
            assert ours.render(messages, add_generation_prompt=generation_prompt) == expected


def test_a_templates_refusal_no_template_and_a_broken_one(tmp_path: Path) -> None:
    ours = ChatTemplate.from_folder(_folder(tmp_path, TEMPLATE))
    assert ours is not None
    with pytest.raises(ValueError, match="no bad roles: x"):
        ours.render([{"role": "bad", "content": "x"}])
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert ChatTemplate.from_folder(tmp_path) is None
    broken = r"chat_template\.jinja: the chat template does not parse"
    with pytest.raises(ConfigError, match=broken):
        (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
        ChatTemplate.from_folder(tmp_path, where=str(tmp_path / "chat_template.jinja"))
