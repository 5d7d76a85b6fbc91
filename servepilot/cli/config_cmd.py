"""`servepilot config`: print the effective configuration, every field with its meaning."""

from __future__ import annotations

import argparse

from servepilot.cli.console import out_console
from servepilot.cli.options import Commands, add_config_flag, config_from_args
from servepilot.core.annotated_yaml import render_yaml
from servepilot.fleet.devices import resolved_lines


def register(sub: Commands) -> None:
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
