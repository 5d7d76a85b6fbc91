"""The load and workload flags that `bench`, `sim` and `tune` share, as typed, and what they
parse into. Each field is its flag's argparse dest, so the CLI fills a record from its
namespace; argparse holds the defaults (as --help states them), this module the parsing and
its refusals, which name the flag typed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.core.units import parse_duration_s
from servepilot.load.agentic import AgenticSpec
from servepilot.load.arrivals import Arrival
from servepilot.load.levels import LevelOptions, parse_levels
from servepilot.load.sweep import SweepConfig
from servepilot.load.trace import load_trace, trace_mean_rate_rps
from servepilot.load.workload import WorkloadKind, WorkloadSpec, parse_priority_mix

AGENTIC_DEFAULTS: Final = AgenticSpec()


@dataclass(frozen=True, slots=True)
class WorkloadFlags:
    workload: str
    input_tokens: int
    output_tokens: int
    seed: int
    long_fraction: float
    long_input_tokens: int | None
    num_prefixes: int
    prefix_tokens: int | None
    turns: int
    active_sessions: int
    trace: Path | None
    priority_mix: str | None
    sessions: int | None
    system_prompts: int = AGENTIC_DEFAULTS.system_prompts
    system_prompt_tokens: int = AGENTIC_DEFAULTS.system_prompt_tokens
    tool_fraction: float = AGENTIC_DEFAULTS.tool_fraction
    tool_tokens: int = AGENTIC_DEFAULTS.tool_tokens
    think_time: float = AGENTIC_DEFAULTS.think_s
    tool_time: float = AGENTIC_DEFAULTS.tool_s
    return_fraction: float = AGENTIC_DEFAULTS.return_fraction
    return_gap: float = AGENTIC_DEFAULTS.return_gap_s

    def spec(self) -> WorkloadSpec:
        mix = self.priority_mix
        agentic = AgenticSpec(
            system_prompts=self.system_prompts, system_prompt_tokens=self.system_prompt_tokens,
            tool_fraction=self.tool_fraction, tool_tokens=self.tool_tokens,
            think_s=self.think_time, tool_s=self.tool_time,
            return_fraction=self.return_fraction, return_gap_s=self.return_gap,
        )  # fmt: skip
        return WorkloadSpec(
            kind=WorkloadKind(self.workload), input_tokens=self.input_tokens,
            output_tokens=self.output_tokens, seed=self.seed, long_fraction=self.long_fraction,
            long_input_tokens=self.long_input_tokens, num_prefixes=self.num_prefixes,
            prefix_tokens=self.prefix_tokens, turns=self.turns,
            active_sessions=self.active_sessions, trace_path=self.trace,
            priority_mix=parse_priority_mix(mix) if mix else None, sessions=self.sessions,
            agentic=agentic,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class LoadFlags:
    concurrency: str | None
    """`1,4,16`: closed-loop levels."""
    rate: str | None
    """`0.5,2`: open-loop levels, requests per second."""
    sweep: bool
    requests: int | None
    duration: str | None
    warmup: int
    arrival: str
    burstiness: float
    soak: str | None = None
    """Only a real client soaks (sim has no --soak)."""

    def check_counts(self) -> None:
        """The simulator's refusals (a real client runs what it is given)."""
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be at least 1, got {self.requests}")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be at least 0, got {self.warmup}")

    def levels(self, workload: WorkloadSpec) -> LevelOptions:
        return LevelOptions(
            workload=workload, loads=self.loads(workload), sweep=self.sweep_config(),
            requests=self.requests_per_level(workload),
            duration_s=parse_duration_s(self.duration, "--duration") if self.duration else None,
            warmup_requests=self.warmup, arrival=Arrival(self.arrival),
            burstiness=self.burstiness,
        )  # fmt: skip

    def requests_per_level(self, workload: WorkloadSpec) -> int | None:
        """--requests; for a trace with neither --requests nor --duration, every line of it
        once (warm-up lines included), not the level's default count (which cut a long trace
        short and repeated a short one)."""
        if self.requests is not None or self.duration:
            return self.requests
        if workload.kind is WorkloadKind.TRACE and workload.trace_path is not None:
            return max(1, len(load_trace(workload.trace_path)) - self.warmup)
        return None

    def loads(self, workload: WorkloadSpec) -> tuple[Load, ...]:
        if self.rate:
            levels = parse_levels(self.rate, "--rate")
            return tuple(Load(mode=LoadMode.RATE, value=v) for v in levels)
        if self.concurrency:
            values = parse_levels(self.concurrency, "--concurrency")
            if any(v != int(v) for v in values):
                raise ConfigError(
                    f"--concurrency {self.concurrency!r}: levels must be whole numbers"
                )
            return tuple(Load(mode=LoadMode.CONCURRENCY, value=v) for v in values)
        if self.sweep:
            return ()
        if workload.kind is WorkloadKind.TRACE and workload.trace_path is not None:
            # A trace is replayed at its own timestamps, which only an open loop does: the
            # level is named by the trace's mean rate (a closed loop at 1 would ignore them).
            return (Load(mode=LoadMode.RATE, value=trace_mean_rate_rps(workload.trace_path)),)
        return (Load(mode=LoadMode.CONCURRENCY, value=1),)

    def sweep_config(self) -> SweepConfig | None:
        if not self.sweep:
            return None
        if self.soak:
            raise ConfigError("--sweep and --soak do not go together: soak runs one load level")
        mode = LoadMode.RATE if self.rate else LoadMode.CONCURRENCY
        start = parse_levels(self.rate or self.concurrency or "1", "--rate")[0]
        return SweepConfig(mode=mode, start=start)
