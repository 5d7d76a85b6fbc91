"""Read a request trace: one JSON object per line, replayed at its timestamps.

    {"timestamp": 12.5, "input_tokens": 900, "output_tokens": 120, "prefix_group": 3, "priority": 0}

`timestamp` is in seconds (any origin; replay is relative to the first line) and must not go
backwards; `prefix_group` (an integer >= 0), `priority` (0, 1 or 2) and `tenant` (a non-empty
string: whose fair share of the gateway's queue the request counts in, in `sim`) are optional.
Other fields are ignored, so traces exported by other tools can carry extra data. Blank lines
are skipped.
Every problem names the file, the line and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.core.errors import ConfigError

PRIORITIES = (0, 1, 2)


@dataclass(frozen=True, slots=True)
class TraceLine:
    line_no: int
    timestamp_s: float
    input_tokens: int
    output_tokens: int
    prefix_group: int | None = None
    priority: int | None = None
    tenant: str | None = None


def load_trace(path: Path) -> list[TraceLine]:
    """Every request of the trace file, in file order."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"--trace {path}: no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--trace {path}: cannot read it: {exc}") from exc
    lines: list[TraceLine] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        line = _parse_line(raw, f"{path}:{line_no}", line_no)
        if lines and line.timestamp_s < lines[-1].timestamp_s:
            raise ConfigError(
                f"{path}:{line_no}: field 'timestamp' goes backwards "
                f"({line.timestamp_s} after {lines[-1].timestamp_s})",
                hint="sort the trace by timestamp",
            )
        lines.append(line)
    if not lines:
        raise ConfigError(f"--trace {path}: the file holds no requests")
    return lines


def trace_mean_rate_rps(path: Path) -> float:
    """Requests per second over the trace's span (1 where it has a single line or no span):
    the name of the open-loop level that replays it."""
    lines = load_trace(path)
    span_s = lines[-1].timestamp_s - lines[0].timestamp_s if lines else 0.0
    return round((len(lines) - 1) / span_s, 3) if span_s > 0 else 1.0


def _parse_line(raw: str, where: str, line_no: int) -> TraceLine:
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    timestamp_s = _number(record, "timestamp", where)
    priority = _optional_int(record, "priority", where, minimum=0)
    if priority is not None and priority not in PRIORITIES:
        raise ConfigError(f"{where}: field 'priority' must be 0, 1 or 2, got {priority}")
    return TraceLine(
        line_no=line_no,
        timestamp_s=timestamp_s,
        input_tokens=_int(record, "input_tokens", where, minimum=1),
        output_tokens=_int(record, "output_tokens", where, minimum=1),
        prefix_group=_optional_int(record, "prefix_group", where, minimum=0),
        priority=priority,
        tenant=_optional_name(record, "tenant", where),
    )


def _optional_name(record: dict[str, Any], field: str, where: str) -> str | None:
    value = record.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: field '{field}' must be a non-empty string, got {value!r}")
    return value


def _number(record: dict[str, Any], field: str, where: str) -> float:
    value = _required(record, field, where)
    # bool is an int subclass in Python; `true` is not a time.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: field '{field}' must be a finite number, got {value!r}")
    return float(value)


def _int(record: dict[str, Any], field: str, where: str, *, minimum: int) -> int:
    value = _required(record, field, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"{where}: field '{field}' must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _optional_int(record: dict[str, Any], field: str, where: str, *, minimum: int) -> int | None:
    if record.get(field) is None:
        return None
    return _int(record, field, where, minimum=minimum)


def _required(record: dict[str, Any], field: str, where: str) -> Any:
    if field not in record:
        raise ConfigError(f"{where}: missing field '{field}'")
    return record[field]
