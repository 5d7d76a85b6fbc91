"""Model specs from local config.json files, and bad input: always a ConfigError naming the
field (presets and shapes: test_plan_spec.py)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from servepilot.core.errors import ConfigError
from servepilot.plan.presets import load_model, load_preset
from servepilot.plan.spec import AttentionKind
from tests.unit.plan_spec_support import (
    STATED,
    compressed_tensors,
    error_from,
    preset_config,
    spec_from,
)

_MIXED_BITS = compressed_tensors(8, "int") | {
    "config_groups": {"g": {"weights": {"num_bits": {"mlp.experts": 4}, "type": "int"}}}
}


# --- local files ---------------------------------------------------------------------------


def _write_config(folder: Path, config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / "config.json"
    file.write_text(json.dumps(config), encoding="utf-8")
    return file


def test_local_folder_with_config_json(tmp_path: Path) -> None:
    folder = tmp_path / "my-llama"
    file = _write_config(folder, preset_config("llama-3.1-8b"))
    spec = load_model(str(folder))
    assert spec.name == "my-llama"
    assert spec.source == str(file.resolve())
    assert spec.params is not None and spec.params.total == 8_030_261_248
    assert spec.stated_params_total is None


def test_local_config_json_file(tmp_path: Path) -> None:
    file = _write_config(tmp_path / "v3", preset_config("deepseek-v3"))
    assert load_model(str(file)).name == "v3"
    other = tmp_path / "deepseek.json"
    other.write_text(file.read_text(encoding="utf-8"), encoding="utf-8")
    spec = load_model(str(other))
    assert spec.name == "deepseek"
    assert spec.attention is AttentionKind.MLA


# --- bad input: always a ConfigError naming the field ---------------------------------------


@pytest.mark.parametrize(
    ("preset", "field"),
    [
        ("llama-3.1-8b", "num_hidden_layers"),
        ("llama-3.1-8b", "hidden_size"),
        ("llama-3.1-8b", "num_attention_heads"),
        ("llama-3.1-8b", "intermediate_size"),
        ("llama-3.1-8b", "vocab_size"),
        ("llama-3.1-8b", "max_position_embeddings"),
        ("deepseek-v3", "kv_lora_rank"),
        ("deepseek-v3", "qk_rope_head_dim"),
        ("deepseek-v3", "v_head_dim"),
        ("deepseek-v3", "moe_intermediate_size"),
        ("deepseek-v3", "num_experts_per_tok"),
        ("deepseek-v3.2", "index_topk"),
        ("deepseek-v4-flash", "head_dim"),
        ("deepseek-v4-flash", "o_lora_rank"),
        ("deepseek-v4-flash", "hc_mult"),
        ("deepseek-v4-flash", "sliding_window"),
        ("deepseek-v4-flash", "compress_ratios"),
        ("deepseek-v4-flash", "n_routed_experts"),
    ],
)
def test_missing_required_field_is_named(preset: str, field: str) -> None:
    config = preset_config(preset)
    del config[field]
    message = error_from(config)
    assert "test-model (/models/test-model)" in message
    assert f"no `{field}`" in message
    assert f"add {field}" in message


def test_unknown_architecture() -> None:
    message = error_from({"architectures": ["BertForMaskedLM"], "hidden_size": 768})
    assert "BertForMaskedLM" in message
    assert "pass a config.json of a decoder-only transformer" in message


def test_missing_architectures() -> None:
    message = error_from({"model_type": "llama", "hidden_size": 4096})
    assert "`architectures`" in message and "decoder-only transformer" in message


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hidden_size": "4096"}, "hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_hidden_layers": True}, "num_hidden_layers"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
        ({"torch_dtype": "float8"}, "torch_dtype"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method"),
        # per-layer bits: more than one format, which one number cannot size
        ({"quantization_config": _MIXED_BITS}, "quant_method"),
    ],
)
def test_bad_values_are_named(changes: dict[str, Any], field: str) -> None:
    message = error_from(preset_config("llama-3.1-8b") | changes)
    assert field in message


def test_v4_compress_ratios_shorter_than_the_layers() -> None:
    config = preset_config("deepseek-v4-flash") | {"compress_ratios": [0, 0, 4]}
    message = error_from(config)
    assert "compress_ratios" in message and "43" in message


def test_config_that_is_not_an_object() -> None:
    assert "JSON object" in error_from([1, 2, 3])


@pytest.mark.parametrize("name", sorted(STATED))
def test_no_single_field_change_escapes_as_another_exception(name: str) -> None:
    """Drop or garble each field of a real config in turn: the result is a spec or a
    ConfigError, never a KeyError/TypeError traceback."""
    config = preset_config(name)
    for key in config:
        for variant in (
            {k: v for k, v in config.items() if k != key},
            config | {key: "garbled"},
            config | {key: None},
            config | {key: -1},
        ):
            with contextlib.suppress(ConfigError):
                spec_from(variant)


def test_folder_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_model(str(tmp_path))
    assert f"{tmp_path} has no config.json" in str(info.value)


def test_unreadable_json_names_the_file(tmp_path: Path) -> None:
    file = tmp_path / "config.json"
    file.write_text("{ not json", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_model(str(tmp_path))
    assert str(file) in str(info.value) and "not valid JSON" in str(info.value)


def test_unknown_name_lists_presets_and_mentions_local_folders() -> None:
    with pytest.raises(ConfigError) as info:
        load_model("no-such-model-xyz")
    message = str(info.value)
    assert "'no-such-model-xyz'" in message
    assert all(name in message for name in STATED)
    assert "local Hugging Face model folder" in message


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError) as info:
        load_preset("gpt-5")
    assert "unknown preset 'gpt-5'" in str(info.value)
