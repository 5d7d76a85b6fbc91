"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from servepilot.bench.tokenizer import LocalTokenizer
from servepilot.core.config import ModelConfig
from servepilot.engine.model_source import resolve_model


@pytest.fixture(scope="module")
def tok() -> LocalTokenizer:
    """The embedded model's (SmolLM2's) real tokenizer, from its converted folder
    (`make model`)."""
    return LocalTokenizer(resolve_model(ModelConfig()).path)
