"""`servepilot bench`'s target and soak flags, as typed, and the run they set up: each field
is its flag's argparse dest (argparse holds the defaults, as --help states them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servepilot.bench.chat_template import measure_chat_frame
from servepilot.bench.client import Target
from servepilot.bench.records import Endpoint
from servepilot.bench.session import BenchOptions
from servepilot.bench.soak import MemorySampler
from servepilot.bench.target import served_model
from servepilot.bench.tokenizer import Tokenizer, open_tokenizer
from servepilot.core.errors import ConfigError
from servepilot.core.slo import Slo, parse_slo
from servepilot.core.units import parse_duration_s
from servepilot.core.urls import base_url
from servepilot.load.levels import LevelOptions


@dataclass(frozen=True, slots=True)
class BenchFlags:
    url: str
    """Refused when missing (argparse leaves it None), before any other flag is read."""
    model: str | None
    """None: the server's only model, asked for."""
    endpoint: str
    api_key: str | None
    tokenizer: Path | None
    metrics_url: str | None
    timeout: float
    soak: str | None
    window: str | None
    processes: int | None
    seed: int
    slo: str | None

    def __post_init__(self) -> None:
        if not self.url:
            raise ConfigError("--url is required", hint="e.g. --url http://127.0.0.1:8000")

    def soak_s(self, levels: LevelOptions) -> float | None:
        if not self.soak:
            return None
        if len(levels.loads) != 1:
            raise ConfigError("--soak runs one load level: give one --concurrency or --rate value")
        return parse_duration_s(self.soak, "--soak")

    def window_s(self, soak_s: float | None) -> float:
        if self.window:
            return parse_duration_s(self.window, "--window")
        return max(10.0, soak_s / 10) if soak_s else 30.0


@dataclass(frozen=True, slots=True)
class BenchSetup:
    options: BenchOptions
    tokenizer: Tokenizer


def bench_setup(
    flags: BenchFlags,
    levels: LevelOptions,
    memory: Callable[[str], MemorySampler | None],
    note: Callable[[str, bool], None],
) -> BenchSetup:
    """The run the flags ask for: the target asked for its model when none is named, its
    tokenizer opened and its chat template measured. `memory(root)`: a soak's memory sources
    beyond the target's /metrics; `note(line, known)`: the chat template's line (a warning
    when not `known`)."""
    root = base_url(flags.url, "--url")
    model = flags.model or served_model(root, flags.api_key)
    target = Target(base_url=root, model=model, endpoint=Endpoint(flags.endpoint),
                    api_key=flags.api_key, timeout_s=flags.timeout)  # fmt: skip
    soak_s = flags.soak_s(levels)
    tokenizer = open_tokenizer(target.base_url, target.model, flags.tokenizer)
    frame = measure_chat_frame(tokenizer, target.endpoint)
    if (line := frame.describe(target.endpoint, tokenizer.name)) is not None:
        note(line, frame.known)
    options = BenchOptions(
        target=target, levels=levels, seed=flags.seed,
        slo=parse_slo(flags.slo) if flags.slo else Slo(),
        soak_s=soak_s, window_s=flags.window_s(soak_s), processes=flags.processes,
        metrics_url=flags.metrics_url, chat=frame,
        memory_sources=memory(root) if soak_s is not None else None,
    )  # fmt: skip
    return BenchSetup(options, tokenizer)
