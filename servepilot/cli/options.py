"""How a command joins the parser, the flags several commands share, and how flags become
fleet.yaml overrides and the typed records of the layers that parse them."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from servepilot.core.config import FleetConfig, load_config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Record = TypeVar("Record", bound=DataclassInstance)


Run = Callable[[argparse.Namespace], int]
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_command(
    sub: Commands, name: str, help: str, description: str, run: Run | None = None
) -> argparse.ArgumentParser:
    """A subcommand whose `description` keeps its line breaks (lists, examples); `run` gets
    the parsed flags and returns the exit code."""
    parser = sub.add_parser(name, help=help, description=description,
                            formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    if run is not None:
        parser.set_defaults(run=run)
    return parser


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", type=Path, metavar="FLEET_YAML",
                        help="fleet.yaml to read (default: none, every setting at "
                             "its default)")  # fmt: skip


def add_server_flags(parser: argparse._ActionsContainer, model_default: str) -> None:
    """--model and --api-key, for a command that talks to an OpenAI-compatible server."""
    parser.add_argument(
        "--model", metavar="NAME", help=f"model to ask for (default: {model_default})"
    )
    parser.add_argument("--api-key", metavar="KEY", help="sent as Authorization: Bearer KEY")


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
