"""The base of every fleet.yaml section: unknown fields refused (a misspelt knob is an error,
not a silent default), values frozen, and each field's docstring kept as its meaning for
`servepilot config`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
