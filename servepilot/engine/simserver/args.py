"""The command line of a simulated replica (`engine.kind: sim`).

A simulated replica (servepilot/engine/simserver/server.py) takes the same flags as vLLM's
server, so its command is vLLM's (args.py server_args: same knobs, same KV memory, same
dtype resolution) run by another module, plus what only the simulator needs: the accelerator
to take the roofline of, a cost profile or a fixed step time, and a tokenizer folder. No
model is loaded, so nothing is converted: `model.source` may be the embedded model, a
Hugging Face folder (only its config.json is read) or a preset name (llama-3.1-8b,
deepseek-v3, ...)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.config import EMBEDDED_MODEL, FleetConfig, ModelConfig
from servepilot.engine.args import KvEventsPorts, LaunchCommand, ServerSpec, server_args
from servepilot.engine.model_source import converted_embedded

SIM_SERVER_MODULE = "servepilot.engine.simserver.server"


@dataclass(frozen=True, slots=True)
class SimModel:
    """What a simulated replica is told about the model."""

    model_arg: str
    """--model: a preset name or a folder holding config.json."""
    served_name: str
    tokenizer: Path | None
    """A folder with tokenizer.json for exact token counts; None: approximate counts."""


def sim_model(model: ModelConfig, tokenizer: str | None = None) -> SimModel:
    source = model.source
    folder = Path(source).expanduser()
    if source == EMBEDDED_MODEL:
        found = converted_embedded()
        default_name, default_tokenizer = EMBEDDED_MODEL, found
    elif folder.is_dir():
        source = str(folder.resolve())
        default_name = folder.resolve().name
        default_tokenizer = folder if (folder / "tokenizer.json").is_file() else None
    else:  # a preset name; the simulated replica says so at startup if it is not one
        default_name, default_tokenizer = source, None
    return SimModel(
        model_arg=source,
        served_name=model.served_name or default_name,
        tokenizer=Path(tokenizer).expanduser() if tokenizer else default_tokenizer,
    )


def sim_launch_command(
    config: FleetConfig,
    model: SimModel,
    host: str,
    port: int,
    kv_events: KvEventsPorts | None = None,
) -> LaunchCommand:
    """`kv_events`: where it publishes its KV events, as a vLLM replica would (engine.kv_events)."""
    engine, hardware = config.engine, config.hardware
    spec = ServerSpec(model.model_arg, model.served_name, host, port, kv_events=kv_events)
    args = server_args(engine, spec, hardware.device)
    args += ["--accelerator", hardware.accelerator]
    if hardware.catalog is not None:
        args += ["--catalog", hardware.catalog]
    if hardware.memory_gib is not None:
        args += ["--memory-gib", repr(hardware.memory_gib)]
    if engine.sim_step_ms is not None:
        args += ["--step-ms", repr(engine.sim_step_ms)]
    elif engine.sim_profile is not None:
        args += ["--profile", str(Path(engine.sim_profile).expanduser())]
    if model.tokenizer is not None:
        args += ["--tokenizer", str(model.tokenizer)]
    # Simulated replicas pin no threads (vLLM-CPU's binding variables do not apply).
    argv = (sys.executable, "-m", SIM_SERVER_MODULE, *args)
    return LaunchCommand(argv=argv, env=dict(engine.env))
