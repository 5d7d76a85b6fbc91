"""A configuration as YAML a user can read, copy and edit: every field with its value and, above
it, its description as a comment (`servepilot config` prints fleet.yaml this way)."""

from __future__ import annotations

import yaml
from pydantic import BaseModel

from servepilot.core.slo import Slo


def render_yaml(model: BaseModel, indent: int = 0) -> str:
    """The model as YAML with each field's docstring as a comment above it."""
    pad = "  " * indent
    lines: list[str] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if field.description:
            lines += [f"{pad}# {line.strip()}" for line in field.description.splitlines()]
        # An Slo is written as its `key: ms` mapping, not field by field (core/slo.py).
        if isinstance(value, BaseModel) and not isinstance(value, Slo):
            lines.append(f"{pad}{name}:")
            lines.append(render_yaml(value, indent + 1))
            continue
        dumped = yaml.safe_dump({name: _plain(value)}, default_flow_style=True, width=10**6)
        lines.append(pad + dumped.strip().removeprefix("{").removesuffix("}"))
    return "\n".join(lines)


def _plain(value: object) -> object:
    if isinstance(value, Slo):
        return value.as_dict()
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "value"):
        return value.value
    return value
