"""The `servepilot` command: one subcommand per step of the serving loop."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from servepilot import __version__
from servepilot.cli.console import err_console, print_error
from servepilot.cli.options import add_command
from servepilot.core import completion
from servepilot.core.config import EMBEDDED_MODEL
from servepilot.core.errors import ConfigError, ServepilotError
from servepilot.plan.hardware import accelerator_names
from servepilot.plan.presets import preset_names

DESCRIPTION = """\
servepilot runs LLM serving on vLLM: it starts vLLM replicas, puts an OpenAI-compatible
gateway in front of them, plans deployments (memory, layout, knobs, cost) and load-tests them.

With no configuration, `servepilot up` serves the embedded SmolLM2-135M-Instruct model on this
machine's CPU. Write a fleet.yaml (see `servepilot config`) to use your own model and GPUs.
"""


COMMANDS = {"plan": "plan_cmd", "up": "up_cmd", "status": "fleet_cmd", "down": "fleet_cmd",
            "logs": "fleet_cmd", "sleep": "warm_cmd", "wake": "warm_cmd",
            "gateway": "gateway_cmd", "bench": "bench_cmd", "calibrate": "calibrate_cmd",
            "profile": "profile_cmd", "sim": "sim_cmd", "tune": "tune_cmd", "k8s": "k8s_cmd",
            "top": "top_cmd", "doctor": "doctor_cmd", "accept": "accept_cmd",
            "models": "models_cmd", "batch": "batch_cmd", "config": "config_cmd",
            "observe": "observe_cmd"}  # fmt: skip
"""Each command's module in servepilot.cli, in the order `servepilot --help` lists them, the
serving loop's. A module is imported only when its parser is built: all of them take most of
a second, and a command line that names one command builds that command's parser alone."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, every subcommand and flag, or with `command` (a key of
    COMMANDS) that command's alone (with its module's other commands); building it starts
    nothing."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="servepilot", description=DESCRIPTION, formatter_class=raw
    )
    parser.add_argument("--version", action="version", version=f"servepilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    names = COMMANDS.values() if command is None else [COMMANDS[command]]
    for name in dict.fromkeys(names):
        importlib.import_module(f"servepilot.cli.{name}").register(sub)
    shells = add_command(
        sub, "completion", "print the shell completion script for bash or zsh",
        "Print a script that completes servepilot's commands, flags and known values.\n"
        "bash: `source <(servepilot completion bash)` in ~/.bashrc; zsh: the same in ~/.zshrc.",
        lambda args: _print_completion(args.shell),
    )  # fmt: skip
    shells.add_argument("shell", choices=completion.SHELLS)
    return parser


def _print_completion(shell: str) -> int:
    values = {"--model": [EMBEDDED_MODEL, *preset_names()], "--accelerator": accelerator_names()}
    print(completion.script(shell, build_parser(), values), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    # --help, --version and a mistyped command need every command's parser.
    parser = build_parser(words[0] if words[0] in COMMANDS else None)
    args = parser.parse_args(words)
    try:
        code: int = args.run(args)
        return code
    except ConfigError as exc:
        print_error(exc)
        return 2
    except ServepilotError as exc:
        print_error(exc)
        return 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
