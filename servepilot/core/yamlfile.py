"""Reading a user's YAML file (fleet.yaml, an accelerator catalog) with errors that name it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from servepilot.core.errors import ConfigError


def read_user_file(path: Path, *, what: str) -> str:
    """The text of `path`; a missing or unreadable file is a ConfigError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file", hint=f"pass an existing {what}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None


def parse_yaml(text: str, *, origin: str) -> Any:
    """The YAML document in `text`; a syntax error names `origin`, the line and the column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{origin}: not valid YAML{where}") from None
