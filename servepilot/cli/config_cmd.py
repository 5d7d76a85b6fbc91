"""`servepilot config`: print the effective configuration, every field with its meaning."""

from __future__ import annotations

import argparse

from servepilot.cli.console import out_console
from servepilot.cli.options import add_config_flag, config_from_args
from servepilot.core.annotated_yaml import render_yaml
from servepilot.core.config import FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.fleet.devices import replica_devices


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "config",
        help="print the effective fleet.yaml (defaults plus your file), with each field explained",
        description="Print the configuration `up` would use, as a fleet.yaml you can copy and "
        "edit: every field, its value, and a comment saying what it does; then, as comments, "
        "what the defaults that depend on the device resolve to (enforce_eager) and the GPUs "
        "each replica gets on this node.",
    )
    add_config_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {})
    out_console.print(render_yaml(config), markup=False, soft_wrap=True)
    out_console.print("\n".join(resolved_lines(config)), markup=False, soft_wrap=True)
    return 0


def resolved_lines(config: FleetConfig) -> list[str]:
    """What `up` would resolve on this node, as YAML comments (the file stays valid)."""
    device = config.hardware.device
    eager = config.engine.enforce_eager_on(device)
    why = "set" if config.engine.enforce_eager is not None else f"by device, {device.value}"
    lines = ["# resolved on this node:", f"#   engine.enforce_eager: {str(eager).lower()} ({why})"]
    try:
        devices = replica_devices(config)
    except ConfigError as exc:
        return [*lines, f"#   GPUs: refused: {exc.message}"]
    if devices is not None:
        lines.append(f"#   GPUs per replica: {devices.describe()}")
    return lines
