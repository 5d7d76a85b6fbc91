"""From what `servepilot tune` was asked to what the search needs: SLA, space, runner, store."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.config import EngineKind, FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.core.results import Run
from servepilot.core.slo import Slo, parse_slo
from servepilot.engine.cpu import cpu_flags
from servepilot.load.workload import WorkloadKind, WorkloadSpec, describe
from servepilot.plan.request import PlanRequest
from servepilot.tune.loadsweep import LoadSweep
from servepilot.tune.planspace import PlanSpace, build_space
from servepilot.tune.policy import Goal
from servepilot.tune.runners.sim import SimTrialRunner
from servepilot.tune.runners.vllm import VllmTrialRunner
from servepilot.tune.search import TrialRunner
from servepilot.tune.space import Knob
from servepilot.tune.store import TrialStore

# Tokens a chat template adds to a prompt (SmolLM2's adds about 30), so max_model_len keeps
# room for them above the workload's own prompt.
TEMPLATE_TOKENS = 64
_FP8_KV_CPU_FLAGS = frozenset({"avx512f", "amx_tile"})


@dataclass(frozen=True, slots=True)
class TuneOptions:
    """What a tuning run was asked for (tune's flags, as given)."""

    engine: EngineKind | None
    """None: fleet.yaml's engine.kind."""
    slo: str | None
    """--slo text; None: fleet.yaml's slo section."""
    knobs: str | None
    """--knobs text; None: every knob."""
    budget_trials: int
    min_gain_pct: float
    max_concurrency: int
    refine_levels: int
    requests_per_level: int | None
    profile: Path | None
    out: Path

    def __post_init__(self) -> None:
        if self.budget_trials < 1:
            raise ConfigError(f"--budget must be at least 1 trial, got {self.budget_trials}")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            raise ConfigError(f"--requests must be at least 1, got {self.requests_per_level}")
        if self.max_concurrency < 1:
            raise ConfigError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if self.refine_levels < 0:
            raise ConfigError(f"--refine-levels must be at least 0, got {self.refine_levels}")
        if not 0 <= self.min_gain_pct < 100:
            raise ConfigError(
                f"--min-gain must be a percentage in [0, 100), got {self.min_gain_pct}"
            )


@dataclass(frozen=True, slots=True)
class TuneSetup:
    config: FleetConfig
    """The fleet config as given, before --engine (its engine.kind goes into the written
    fleet.yaml: tuned on the simulator, deployed on vLLM)."""
    space: PlanSpace
    goal: Goal
    sweep: LoadSweep
    workload: WorkloadSpec
    runner: TrialRunner
    store: TrialStore
    out: Path
    engine: EngineKind


def build_setup(
    opts: TuneOptions,
    given: FleetConfig,
    workload: WorkloadSpec,
    on_level: Callable[[Run, Slo], None],
    on_step: Callable[[str], None],
) -> TuneSetup:
    """`given`: fleet.yaml (or the defaults) without --engine; `on_level` hears every
    measured load level, `on_step` what a vLLM trial is doing."""
    engine = opts.engine or given.engine.kind
    config = given.with_overrides({"engine.kind": engine.value})
    sla = _sla(opts.slo, config)
    longest_in, longest_out = longest_request(workload)
    planning = config.with_overrides(
        {
            "traffic.input_tokens": workload.input_tokens,
            "traffic.output_tokens": workload.output_tokens,
            "traffic.max_input_tokens": longest_in + TEMPLATE_TOKENS,
            "traffic.max_output_tokens": longest_out,
        }
    )
    space = build_space(
        planning,
        PlanRequest.from_fleet(planning, cpu_flags()),
        longest_request_tokens=longest_in + longest_out + TEMPLATE_TOKENS,
        knobs=parse_knobs(opts.knobs),
        cpu_fp8_kv=bool(cpu_flags() & _FP8_KV_CPU_FLAGS),
    )
    sweep = LoadSweep(
        max_value=float(opts.max_concurrency),
        refine_levels=opts.refine_levels,
        requests_per_level=opts.requests_per_level,
    )

    def level(run: Run) -> None:
        on_level(run, sla)

    runner = _runner(engine, space, workload, sweep, sla, opts, level, on_step)
    context = _context(engine, space, workload, sla, sweep, opts.profile)
    store = TrialStore(opts.out / "trials.jsonl", context)
    goal = Goal(sla, opts.budget_trials, opts.min_gain_pct / 100.0)
    return TuneSetup(given, space, goal, sweep, workload, runner, store, opts.out, engine)


def longest_request(workload: WorkloadSpec) -> tuple[int, int]:
    """(longest prompt, longest output) in tokens the workload sends."""
    prompt = workload.input_tokens
    if workload.kind is WorkloadKind.MIXED:
        prompt = workload.long_input_tokens or 4 * workload.input_tokens
    elif workload.kind is WorkloadKind.MULTI_TURN:
        turns = workload.turns
        prompt = turns * workload.input_tokens + (turns - 1) * workload.output_tokens
    elif workload.kind is WorkloadKind.TRACE:
        raise ConfigError(
            "--workload trace is not supported by tune yet: its request sizes are not known "
            "before it is read",
            hint="use random, mixed, shared_prefix or multi_turn with the trace's sizes",
        )
    return prompt, workload.output_tokens


def parse_knobs(text: str | None) -> frozenset[Knob] | None:
    """`max_num_seqs,max_model_len` -> those knobs; None (every knob) for no text."""
    if not text:
        return None
    knobs = set()
    for part in text.split(","):
        try:
            knobs.add(Knob(part.strip()))
        except ValueError:
            known = ", ".join(k.value for k in Knob)
            raise ConfigError(
                f"--knobs {text!r}: {part.strip()!r} is not a knob", hint=f"knobs: {known}"
            ) from None
    return frozenset(knobs)


def _sla(text: str | None, config: FleetConfig) -> Slo:
    if text:
        return parse_slo(text)
    if not config.slo.limits:
        raise ConfigError(
            "tune needs an SLA: no --slo and no slo section in fleet.yaml",
            hint="e.g. --slo ttft_p99_ms=2000,tpot_p99_ms=100",
        )
    return config.slo


def _runner(
    engine: EngineKind,
    space: PlanSpace,
    workload: WorkloadSpec,
    sweep: LoadSweep,
    sla: Slo,
    opts: TuneOptions,
    on_level: Callable[[Run], None],
    on_step: Callable[[str], None],
) -> TrialRunner:
    if engine is EngineKind.SIM:
        return SimTrialRunner(space, workload, sweep, sla, opts.profile, on_level)
    if opts.profile is not None:
        raise ConfigError("--profile applies to --engine sim only")
    return VllmTrialRunner(space, workload, sweep, sla, opts.out / "logs", on_level, on_step)


def _context(
    engine: EngineKind,
    space: PlanSpace,
    workload: WorkloadSpec,
    sla: Slo,
    sweep: LoadSweep,
    profile: Path | None,
) -> str:
    """What every trial's numbers depend on besides its own knobs."""
    base = space.base.model_dump(mode="json")
    data = {
        "engine": engine.value,
        "base": base,
        "workload": describe(workload),
        "sla": sla.as_dict(),
        "sweep": [sweep.max_value, sweep.refine_levels, sweep.requests_per_level],
        "profile": str(profile) if profile is not None else None,
    }
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
