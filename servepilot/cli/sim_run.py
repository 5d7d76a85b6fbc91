"""Running `servepilot sim` for the terminal: levels or a sweep, progress, the result files.

A level is what bench would run at that load: the workload of `--seed + level index` (bench's
`build_workload` seeds, as token counts from `bench.shapes.workload_shapes`), the same number
of requests (or bench's cycled pool for a `--duration`), the arrival schedule of `--seed`, the
same warm-up. The sweep asks bench's `next_step` for each next level and bench's `sweet_spot`
for the best one, so a simulated sweep stops where a measured one would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text

from servepilot.bench.session import default_requests
from servepilot.cli.console import print_step
from servepilot.cli.levels_view import fmt_load, level_bars, print_runs, write_results_json
from servepilot.core.config import SloConfig
from servepilot.core.results import BenchResult, Load, LoadMode, Run, Source
from servepilot.load.arrivals import Arrival, iter_arrival_offsets_s
from servepilot.load.shapes import workload_shapes
from servepilot.load.sweep import SweepConfig, next_step, sweet_spot
from servepilot.load.workload import WorkloadSpec, describe
from servepilot.scaling.snapshot import AutoscalePolicy
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec, FleetStats, LevelOutcome
from servepilot.sim.fleet.simulator import Progress as SimProgress
from servepilot.sim.fleet.traffic import Job, JobTable, LevelPlan, trace_offsets

# bench/session.py: a duration-bound level cycles a pool of at most this many requests.
DURATION_POOL_MAX = 20_000


@dataclass(frozen=True, slots=True)
class SimOptions:
    spec: FleetSpec
    workload: WorkloadSpec
    loads: tuple[Load, ...]
    sweep: SweepConfig | None
    requests: int | None
    duration_s: float | None
    warmup_requests: int
    arrival: Arrival
    burstiness: float
    slo: SloConfig
    prompt_overhead_tokens: int
    target: dict[str, Any]
    autoscaler: Callable[[], AutoscalePolicy] | None = None


@dataclass(frozen=True, slots=True)
class SimOutput:
    result: BenchResult
    stats: tuple[FleetStats, ...]


def level_plan(opts: SimOptions, load: Load) -> LevelPlan:
    requests = None
    if opts.duration_s is None:
        requests = opts.requests or default_requests(load)
    return LevelPlan(load, requests, opts.duration_s, opts.warmup_requests)


def pool_size(opts: SimOptions, plan: LevelPlan) -> int:
    """How many distinct requests the level's workload holds (bench's `_workload_size`)."""
    if plan.max_requests is not None:
        return plan.max_requests + opts.warmup_requests
    value = plan.load.value
    per_s = value if plan.load.mode is LoadMode.RATE else 4 * value
    wanted = int(per_s * (plan.duration_s or 0) * 1.2) + opts.warmup_requests + 100
    return min(DURATION_POOL_MAX, wanted)


def level_jobs(workload: WorkloadSpec, count: int, overhead_tokens: int) -> JobTable:
    """The workload's requests as the server sees them: the chat template's tokens on top of
    each prompt and its history; the gateway routes on the text alone."""
    shapes = workload_shapes(workload, count)
    return JobTable(
        Job(
            prompt_tokens=s.input_tokens + s.history_tokens + overhead_tokens,
            output_tokens=s.output_tokens,
            prefix_group=s.prefix_group,
            prefix_tokens=s.prefix_tokens,
            priority=1 if s.priority is None else s.priority,
            session_id=s.session_id,
            at_s=s.at_s,
            routed_tokens=s.input_tokens + s.history_tokens,
        )
        for s in shapes
    )


def level_offsets(opts: SimOptions, plan: LevelPlan, jobs: JobTable) -> Iterator[float] | None:
    if plan.closed:
        return None
    if jobs.at_s is not None:
        return trace_offsets(jobs.at_s)
    return iter_arrival_offsets_s(
        plan.load.value, opts.arrival, burstiness=opts.burstiness, seed=opts.workload.seed
    )


def run_level(
    opts: SimOptions,
    index: int,
    load: Load,
    progress: Callable[[SimProgress], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> LevelOutcome:
    plan = level_plan(opts, load)
    workload = dataclasses.replace(opts.workload, seed=opts.workload.seed + index)
    jobs = level_jobs(workload, pool_size(opts, plan), opts.prompt_overhead_tokens)
    longest = opts.spec.scheduler.max_model_len
    too_long = sum(1 for p, o in zip(jobs.prompt, jobs.output, strict=True) if p + o > longest)
    if too_long and note is not None:
        note(
            f"{too_long:,} of the level's {len(jobs):,} requests are longer than max_model_len "
            f"({longest:,} tokens): vLLM answers them 400, and so does the simulation"
        )
    autoscaler = opts.autoscaler() if opts.autoscaler is not None else None
    sim = FleetSim(opts.spec, autoscaler=autoscaler)
    offsets = level_offsets(opts, plan, jobs)
    return sim.run(plan, jobs, opts.slo, offsets=offsets, progress=progress)


def simulate(
    opts: SimOptions,
    on_level: Callable[[Load, LevelPlan], Callable[[SimProgress], None] | None] | None = None,
    on_done: Callable[[Run], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> SimOutput:
    runs: list[Run] = []
    stats: list[FleetStats] = []
    index = 0
    while True:
        load = _next_load(opts, runs, index)
        if load is None:
            break
        progress = on_level(load, level_plan(opts, load)) if on_level is not None else None
        outcome = run_level(opts, index, load, progress, note)
        runs.append(outcome.run)
        stats.append(outcome.stats)
        if on_done is not None:
            on_done(outcome.run)
        index += 1
    slo = _slo_dict(opts.slo)
    result = BenchResult(
        source=Source.SIMULATED,
        target=opts.target | {"levels": [_stats_dict(s) for s in stats]},
        workload=describe(opts.workload),
        slo=slo,
        runs=tuple(runs),
        sweet_spot=sweet_spot(runs, slo_set=bool(slo)) if len(runs) > 1 else None,
    )
    return SimOutput(result, tuple(stats))


def _next_load(opts: SimOptions, runs: list[Run], index: int) -> Load | None:
    if opts.sweep is None:
        return opts.loads[index] if index < len(opts.loads) else None
    return next_step(opts.sweep, runs).load


def _slo_dict(slo: SloConfig) -> dict[str, float]:
    return {k: v for k, v in slo.model_dump().items() if v is not None}


def _stats_dict(stats: FleetStats) -> dict[str, Any]:
    return {
        "simulated_s": round(stats.sim_s, 3),
        "steps": stats.steps,
        "preemptions": stats.preemptions,
        "prefix_hit_rate": round(stats.prefix_hit_rate, 4),
        "replicas_peak": stats.replicas_peak,
        "replicas_end": stats.replicas_end,
        "shed": stats.shed,
        "queued_in_gateway": stats.queued,
        "wall_s": round(stats.wall_s, 2),
    }


# ---- the terminal ------------------------------------------------------------------------


def run_with_progress(opts: SimOptions) -> SimOutput:
    with level_bars() as bars:

        def started(load: Load, plan: LevelPlan) -> Callable[[SimProgress], None]:
            by_count = plan.max_requests is not None
            total = (plan.max_requests or 0) + opts.warmup_requests if by_count else None
            bars.start(load, total or plan.duration_s)

            def progress(p: SimProgress) -> None:
                done = p.completed + p.failed if by_count else p.sim_s
                counts = f"{p.completed:,} ok" + (f", {p.failed:,} failed" if p.failed else "")
                bars.update(load, done, f"{counts} · {p.sim_s:,.0f} s simulated")

            return progress

        def note(message: str) -> None:
            bars.note(Text("warning: ", style="bold yellow") + Text(message))

        return simulate(opts, started, bars.finish, note)


def report(output: SimOutput, out_dir: Path | None) -> None:
    result = output.result
    print_runs(result)
    for run, stats in zip(result.runs, output.stats, strict=True):
        rate = (run.completed + run.failed) / stats.wall_s if stats.wall_s > 0 else 0.0
        print_step(
            f"{fmt_load(run.load)}: {stats.sim_s:,.1f} s simulated in {stats.wall_s:,.1f} s "
            f"({rate:,.0f} requests/s); {stats.steps:,} steps, {stats.preemptions:,} "
            f"preemptions, prefix hit rate {stats.prefix_hit_rate:.0%}"
        )
    if out_dir is not None:
        write_results_json(out_dir, result)
        print_step(f"wrote {out_dir}/results.json (compare: servepilot bench compare)")
