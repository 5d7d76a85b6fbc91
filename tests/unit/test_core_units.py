"""Durations as users type them: known answers, and errors that name the flag."""

from __future__ import annotations

import pytest

from servepilot.core.errors import ConfigError
from servepilot.core.units import parse_duration_or_zero_s, parse_duration_s


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        (" 10m ", 600.0),
        ("2h", 7200.0),
        ("500ms", 0.5),
        ("1.5 m", 90.0),
    ],
)
def test_durations_in_every_unit(text: str, seconds: float) -> None:
    assert parse_duration_s(text, "--duration") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "5d", "-1s", "1e3s"])
def test_what_is_not_a_duration_is_named(text: str) -> None:
    with pytest.raises(ConfigError, match=f"--soak {text!r}: expected a duration such as 90s"):
        parse_duration_s(text, "--soak")


def test_zero_is_refused_unless_the_delay_can_be_off() -> None:
    with pytest.raises(ConfigError, match="--window '0s': must be longer than zero"):
        parse_duration_s("0s", "--window")
    assert parse_duration_or_zero_s("0", "--cold-start") == 0.0
    assert parse_duration_or_zero_s(" 0s ", "--cold-start") == 0.0
    assert parse_duration_or_zero_s("78s", "--cold-start") == 78.0
    with pytest.raises(ConfigError, match="--cold-start '0m': must be longer than zero"):
        parse_duration_or_zero_s("0m", "--cold-start")
