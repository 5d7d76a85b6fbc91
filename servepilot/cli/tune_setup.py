"""From `servepilot tune`'s flags to what the search needs: SLA, space, runner, store."""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from servepilot.bench.report.fmt import format_load
from servepilot.cli.console import print_step
from servepilot.core.config import EngineKind, FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.core.results import Run
from servepilot.engine.cpu import cpu_flags
from servepilot.load.workload import WorkloadKind, WorkloadSpec, describe
from servepilot.plan.request import PlanRequest
from servepilot.tune.loadsweep import LoadSweep
from servepilot.tune.planspace import PlanSpace, build_space
from servepilot.tune.policy import Goal
from servepilot.tune.runners.sim import SimTrialRunner
from servepilot.tune.runners.vllm import VllmTrialRunner
from servepilot.tune.search import TrialRunner
from servepilot.tune.sla import Sla, meets, parse_sla, worst
from servepilot.tune.space import Knob
from servepilot.tune.store import TrialStore

# Tokens a chat template adds to a prompt (SmolLM2's adds about 30), so max_model_len keeps
# room for them above the workload's own prompt.
TEMPLATE_TOKENS = 64
_FP8_KV_CPU_FLAGS = frozenset({"avx512f", "amx_tile"})


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


def build_setup(args: argparse.Namespace, given: FleetConfig, workload: WorkloadSpec) -> TuneSetup:
    """`args`: tune's flags; `given`: fleet.yaml (or the defaults) without --engine."""
    engine = EngineKind(args.engine) if args.engine else given.engine.kind
    config = given.with_overrides({"engine.kind": engine.value})
    sla = _sla(args.slo, config)
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
        knobs=_knobs(args.knobs),
        cpu_fp8_kv=bool(cpu_flags() & _FP8_KV_CPU_FLAGS),
    )
    sweep = LoadSweep(
        max_value=float(args.max_concurrency),
        refine_levels=args.refine_levels,
        requests_per_level=args.requests,
    )
    runner = _runner(engine, space, workload, sweep, sla, args)
    context = _context(engine, space, workload, sla, sweep, args.profile)
    store = TrialStore(args.out / "trials.jsonl", context)
    goal = Goal(sla, args.budget, args.min_gain / 100.0)
    return TuneSetup(given, space, goal, sweep, workload, runner, store, args.out, engine)


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


def _sla(text: str | None, config: FleetConfig) -> Sla:
    if text:
        return parse_sla(text)
    given = {k: v for k, v in config.slo.model_dump().items() if v is not None}
    if not given:
        raise ConfigError(
            "tune needs an SLA: no --slo and no slo section in fleet.yaml",
            hint="e.g. --slo ttft_p99_ms=2000,tpot_p99_ms=100",
        )
    return parse_sla(",".join(f"{k}={v}" for k, v in given.items()), flag="fleet.yaml slo")


def _knobs(text: str | None) -> frozenset[Knob] | None:
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


def _runner(
    engine: EngineKind,
    space: PlanSpace,
    workload: WorkloadSpec,
    sweep: LoadSweep,
    sla: Sla,
    args: argparse.Namespace,
) -> TrialRunner:
    def level(run: Run) -> None:
        print_step(level_line(run, sla))

    if engine is EngineKind.SIM:
        return SimTrialRunner(space, workload, sweep, sla, args.profile, level)
    if args.profile is not None:
        raise ConfigError("--profile applies to --engine sim only")
    return VllmTrialRunner(space, workload, sweep, sla, args.out / "logs", level, print_step)


def level_line(run: Run, sla: Sla) -> str:
    found = worst(run, sla)
    limit = f"{found.key} {found.observed_ms:,.0f} ms" if found is not None else "no latency"
    verdict = "meets the SLA" if meets(run, sla) else "misses the SLA"
    failed = f", {run.failed} failed" if run.failed else ""
    return (
        f"  {format_load(run.load)}: {run.goodput_rps:.3f} req/s goodput, {limit}{failed} "
        f"— {verdict}"
    )


def _context(
    engine: EngineKind,
    space: PlanSpace,
    workload: WorkloadSpec,
    sla: Sla,
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
