"""Quantities as users type them on the command line: durations such as 90s, 10m or 2h."""

from __future__ import annotations

import re

from servepilot.core.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration_s(text: str, flag: str) -> float:
    """`90`, `90s`, `10m`, `2h`, `500ms` -> seconds; `flag` names the setting in errors."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(f"{flag} {text!r}: expected a duration such as 90s, 10m or 2h")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise ConfigError(f"{flag} {text!r}: must be longer than zero")
    return seconds


def parse_duration_or_zero_s(text: str, flag: str) -> float:
    """As parse_duration_s, but `0` and `0s` are allowed: zero, for a delay that can be off."""
    if text.strip() in ("0", "0s"):
        return 0.0
    return parse_duration_s(text, flag)
