"""fleet.yaml as `servepilot config` prints it: every field, its value, its description above."""

from __future__ import annotations

import enum

import yaml
from pydantic import BaseModel, Field

from servepilot.core.annotated_yaml import render_yaml
from servepilot.core.config import FleetConfig
from servepilot.core.slo import parse_slo


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


def test_the_slo_is_written_as_its_limits_with_the_keys_explained() -> None:
    config = FleetConfig(slo=parse_slo("itl_p99_ms=250,ttft_p50_ms=800,ttft_p99_ms=4000"))
    text = render_yaml(config)
    assert "\nslo: {itl_p99_ms: 250.0, ttft_p50_ms: 800.0, ttft_p99_ms: 4000.0}\n" in text
    assert "# <ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms" in text
    back = FleetConfig.model_validate(yaml.safe_load(text))
    assert back == config
    assert back.slo.describe() == "itl_p99_ms=250, ttft_p50_ms=800, ttft_p99_ms=4000"
    assert "\nslo: {}\n" in render_yaml(FleetConfig())
