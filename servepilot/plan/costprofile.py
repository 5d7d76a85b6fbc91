"""Cost profile files: a `CostModel` saved as JSON (schema `servepilot.costmodel/v1`) with
what was measured, and read back with every field checked."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import COEFFICIENTS, CostModel

PROFILE_SCHEMA = "servepilot.costmodel/v1"


def save_profile(model: CostModel, path: Path, *, meta: Mapping[str, Any]) -> None:
    """Write `model` as JSON (schema `servepilot.costmodel/v1`); `meta` says what was
    measured (URL, date, model, sample count, fit error). Written to a temporary file and
    renamed, so a reader never sees half a profile."""
    document = {
        "schema": PROFILE_SCHEMA,
        "source": model.source,
        "coefficients": dict(zip(COEFFICIENTS, model.coefficients, strict=True)),
        "meta": dict(meta),
    }
    text = json.dumps(document, indent=2, sort_keys=False, allow_nan=False) + "\n"
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def load_profile(path: Path) -> CostModel:
    """Read a profile written by `save_profile`; a bad file is a ConfigError naming the file
    and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such cost profile", hint="create one with `servepilot calibrate`"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    return _profile_from(document, path)


def _profile_from(document: Any, path: Path) -> CostModel:
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    unknown = sorted(set(document) - {"schema", "source", "coefficients", "meta"})
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown field")
    if document.get("schema") != PROFILE_SCHEMA:
        raise ConfigError(
            f"{path}: schema: expected {PROFILE_SCHEMA!r}, got {document.get('schema')!r}"
        )
    source = document.get("source")
    if not isinstance(source, str) or not source:
        raise ConfigError(f"{path}: source: expected a non-empty string")
    if not isinstance(document.get("meta", {}), dict):
        raise ConfigError(f"{path}: meta: expected an object")
    raw = document.get("coefficients")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: coefficients: expected an object with {', '.join(COEFFICIENTS)}"
        )
    unknown = sorted(set(raw) - set(COEFFICIENTS))
    if unknown:
        raise ConfigError(f"{path}: coefficients.{unknown[0]}: unknown field")
    values: dict[str, float] = {}
    for name in COEFFICIENTS:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: coefficients.{name}: expected a number, got {value!r}")
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(
                f"{path}: coefficients.{name}: must be finite and >= 0, got {value!r}"
            )
        values[name] = float(value)
    return CostModel.of(values, source=source)
