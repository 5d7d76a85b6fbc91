"""fleet.yaml as `servepilot config` prints it: every field, its value, its description above."""

from __future__ import annotations

import enum

import yaml
from pydantic import BaseModel, Field

from servepilot.core.annotated_yaml import render_yaml
from servepilot.core.config import FleetConfig


class Color(enum.StrEnum):
    RED = "red"


class Inner(BaseModel):
    ports: tuple[int, ...] = Field((8000, 8001), description="Ports to try,\n  in order.")
    color: Color = Color.RED


class Outer(BaseModel):
    name: str | None = Field(None, description="Who.")
    inner: Inner = Field(default_factory=Inner, description="The nested part.")


def test_fields_are_commented_nested_and_plain() -> None:
    assert render_yaml(Outer()) == "\n".join(
        [
            "# Who.",
            "name: null",
            "# The nested part.",
            "inner:",
            "  # Ports to try,",
            "  # in order.",
            "  ports: [8000, 8001]",
            "  color: red",
        ]
    )


def test_the_default_fleet_yaml_reads_back_as_the_default_config() -> None:
    text = render_yaml(FleetConfig())
    assert text.startswith("# Which model to serve.\nmodel:\n")
    assert FleetConfig.model_validate(yaml.safe_load(text)) == FleetConfig()
