"""The `servepilot` command: one subcommand per step of the serving loop."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from servepilot import __version__
from servepilot.cli import (
    accept_cmd,
    batch_cmd,
    bench_cmd,
    calibrate_cmd,
    config_cmd,
    doctor_cmd,
    fleet_cmd,
    gateway_cmd,
    k8s_cmd,
    models_cmd,
    observe_cmd,
    plan_cmd,
    profile_cmd,
    sim_cmd,
    top_cmd,
    tune_cmd,
    up_cmd,
    warm_cmd,
)
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


COMMANDS = (plan_cmd, up_cmd, fleet_cmd, warm_cmd, gateway_cmd, bench_cmd, calibrate_cmd,
            profile_cmd, sim_cmd, tune_cmd, k8s_cmd, top_cmd, doctor_cmd, accept_cmd,
            models_cmd, batch_cmd, config_cmd, observe_cmd)  # fmt: skip
"""In the order `servepilot --help` lists them, the serving loop's."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, every subcommand and flag; building it starts nothing."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="servepilot", description=DESCRIPTION, formatter_class=raw
    )
    parser.add_argument("--version", action="version", version=f"servepilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
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
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv) or ["--help"])
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
