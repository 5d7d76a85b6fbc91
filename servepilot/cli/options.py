"""Flags shared by several commands, and how they override fleet.yaml."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from servepilot.core.config import FleetConfig, load_config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Record = TypeVar("Record", bound=DataclassInstance)


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="FLEET_YAML",
        help="fleet.yaml to read (default: none, every setting at its default)",
    )


def config_from_args(args: argparse.Namespace, flags: dict[str, str]) -> FleetConfig:
    """fleet.yaml (or the defaults), then the flags that were given, validated together.

    `flags` maps a fleet.yaml path to the argparse dest of the flag that sets it
    (`{"traffic.target_qps": "qps"}`), so an invalid value's error names the flag typed
    (`--qps`) next to the field it sets.
    """
    config = load_config(args.config)
    given = {path: getattr(args, dest) for path, dest in flags.items()}
    given = {path: value for path, value in given.items() if value is not None}
    if not given:
        return config
    names = {path: "--" + flags[path].replace("_", "-") for path in given}
    return config.with_overrides(given, names)


def record_of(cls: type[Record], args: argparse.Namespace, **given: Any) -> Record:
    """The flags record `cls` (of the layer that parses them) from the parsed flags whose dests
    are its field names; a field the command has no flag for keeps its default, `given` sets
    the others."""
    names = {f.name for f in dataclasses.fields(cls)} - given.keys()
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)}, **given)


def add_fleet_choice(parser: argparse.ArgumentParser) -> None:
    """--url or --port, as `status`, `down` and `logs` pick a fleet by --port."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--url", metavar="URL",
                       help="the gateway (default: the fleet `up` runs here)")  # fmt: skip
    which.add_argument("--port", type=int, metavar="P",
                       help="the fleet `up` runs here on this port")  # fmt: skip
