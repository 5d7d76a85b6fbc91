"""Parsing `servepilot bench` flag values: lists of levels, durations."""

from __future__ import annotations

import re

from servepilot.core.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_levels(text: str, flag: str) -> tuple[float, ...]:
    """`1,4,16` -> (1.0, 4.0, 16.0); every value positive."""
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: {part!r} is not a number") from None
        if value <= 0:
            raise ConfigError(f"{flag} {text!r}: levels must be positive")
        values.append(value)
    return tuple(values)


def parse_duration_s(text: str, flag: str) -> float:
    """`90`, `90s`, `10m`, `2h`, `500ms` -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(f"{flag} {text!r}: expected a duration such as 90s, 10m or 2h")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise ConfigError(f"{flag} {text!r}: must be longer than zero")
    return seconds
