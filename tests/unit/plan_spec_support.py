"""What the model spec tests share (test_plan_spec.py, test_plan_spec_input.py)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from servepilot.core.errors import ConfigError
from servepilot.plan.hf_config import spec_from_hf_config
from servepilot.plan.spec import ModelSpec

# The parameter totals the model cards state (what the presets must carry).
STATED = {
    "deepseek-v3": 671_000_000_000,  # README_WEIGHTS.md: main model, embedding and head included
    "deepseek-v3.2": 685_000_000_000,  # model card, MTP module included
    "deepseek-v4-flash": 284_000_000_000,  # model card: 284B total / 13B active
    "deepseek-v2-lite": 15_700_000_000,  # model card: 15.7B total / 2.4B active
    "llama-3.1-8b": 8_030_000_000,
    "llama-3.1-70b": 70_600_000_000,
    "qwen3-32b": 32_800_000_000,
    "qwen2.5-32b": 32_500_000_000,  # model card: 32.5B (counted: 32.76B, within 1%)
    "smollm2": 135_000_000,
}


def preset_config(name: str) -> dict[str, Any]:
    file = resources.files("servepilot.plan").joinpath("presets", f"{name}.json")
    config: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))["config"]
    return config


def spec_from(config: dict[str, Any]) -> ModelSpec:
    return spec_from_hf_config(config, name="test-model", source="/models/test-model")


def error_from(config: Any) -> str:
    with pytest.raises(ConfigError) as info:
        spec_from_hf_config(config, name="test-model", source="/models/test-model")
    return str(info.value)


def compressed_tensors(bits: int, kind: str) -> dict[str, Any]:
    weights = {"num_bits": bits, "type": kind, "strategy": "channel", "symmetric": True}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None}
    return {"quant_method": "compressed-tensors", "format": "int-quantized",
            "config_groups": {"group_0": group}}  # fmt: skip
