"""`servepilot config`: print the effective configuration, every field with its meaning."""

from __future__ import annotations

import argparse

from pydantic import BaseModel

from servepilot.cli.console import out_console
from servepilot.cli.options import add_config_flag, config_from_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "config",
        help="print the effective fleet.yaml (defaults plus your file), with each field explained",
        description="Print the configuration `up` would use, as a fleet.yaml you can copy and "
        "edit: every field, its value, and a comment saying what it does.",
    )
    add_config_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {})
    out_console.print(render_yaml(config), markup=False, soft_wrap=True)
    return 0


def render_yaml(model: BaseModel, indent: int = 0) -> str:
    """The model as YAML with each field's docstring as a comment above it."""
    import yaml

    pad = "  " * indent
    lines: list[str] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if field.description:
            lines += [f"{pad}# {line.strip()}" for line in field.description.splitlines()]
        if isinstance(value, BaseModel):
            lines.append(f"{pad}{name}:")
            lines.append(render_yaml(value, indent + 1))
            continue
        dumped = yaml.safe_dump({name: _plain(value)}, default_flow_style=True, width=10**6)
        lines.append(pad + dumped.strip().removeprefix("{").removesuffix("}"))
    return "\n".join(lines)


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "value"):
        return value.value
    return value
