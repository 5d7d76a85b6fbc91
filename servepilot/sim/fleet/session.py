"""One `servepilot sim` run: its load levels (given or swept), each on a fresh fleet, and the
result in bench's schema.

A level is what bench would run at that load (`load.levels`, the same rules): the workload of
`--seed + level index` as token counts (`load.shapes`, bench's layout), the same number of
requests (or the same cycled pool for a `--duration`), the arrival schedule of `--seed`, the
same warm-up. The sweep asks the same `next_step` for each next level and `sweet_spot` for the
best one, so a simulated sweep stops where a measured one would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from servepilot.core.config import AdaptiveBudgetConfig
from servepilot.core.errors import ConfigError
from servepilot.core.results import BenchResult, Load, Run, Source
from servepilot.core.slo import Slo
from servepilot.load.levels import LevelOptions, pool_size
from servepilot.load.loadplan import LoadPlan
from servepilot.load.shapes import workload_shapes
from servepilot.load.slots import open_slots, send_times
from servepilot.load.sweep import sweet_spot
from servepilot.load.workload import WorkloadKind, WorkloadSpec, describe
from servepilot.scaling.adaptive_budget import AdaptiveBudget
from servepilot.scaling.oracle import OracleSetup
from servepilot.scaling.policies import AutoscaleSetup
from servepilot.scaling.snapshot import AutoscalePolicy
from servepilot.sim.fleet.agentic import SessionFeed
from servepilot.sim.fleet.records import FleetSpec, FleetStats, LevelOutcome, Progress
from servepilot.sim.fleet.simulator import FleetSim
from servepilot.sim.fleet.traffic import Job, JobTable


@dataclass(frozen=True, slots=True)
class SimOptions:
    spec: FleetSpec
    levels: LevelOptions
    slo: Slo
    prompt_overhead_tokens: int
    target: dict[str, Any]
    """The results file's "target" section (what was simulated)."""
    autoscaler: AutoscaleSetup | OracleSetup | None = None
    """Builds each level's policy (a fresh one per level); the oracle is told the level's
    schedule."""
    budget: AdaptiveBudgetConfig | None = None
    """autoscale.adaptive_budget, when enabled: a fresh one per level, beside the policy."""

    def level_budget(self) -> AdaptiveBudget | None:
        return AdaptiveBudget(self.budget) if self.budget is not None else None


@dataclass(frozen=True, slots=True)
class SimOutput:
    result: BenchResult
    stats: tuple[FleetStats, ...]


def level_plan(opts: SimOptions, load: Load) -> LoadPlan:
    """The level at `load`; its arrivals follow the workload's seed, as bench's `--seed`."""
    return opts.levels.plan(load, seed=opts.levels.workload.seed)


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
            tenant=s.tenant,
        )
        for s in shapes
    )


def level_offsets(plan: LoadPlan, jobs: JobTable) -> Iterator[float] | None:
    """The open loop's send times; None for the closed loop."""
    return None if plan.closed else send_times(plan, jobs.at_s)


def run_level(
    opts: SimOptions,
    index: int,
    load: Load,
    progress: Callable[[Progress], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> LevelOutcome:
    plan = level_plan(opts, load)
    workload = opts.levels.level_workload(index)
    if workload.kind is WorkloadKind.AGENTIC:
        sim = FleetSim(opts.spec, autoscaler=level_policy(opts.autoscaler, plan, None),
                       budget=opts.level_budget())  # fmt: skip
        feed = SessionFeed(plan, workload, opts.prompt_overhead_tokens)
        offsets = None if plan.closed else send_times(plan, None)
        return sim.run(plan, feed.jobs, opts.slo, offsets=offsets, progress=progress,
                       sessions=feed)  # fmt: skip
    jobs = level_jobs(workload, pool_size(plan), opts.prompt_overhead_tokens)
    longest = opts.spec.scheduler.max_model_len
    too_long = sum(1 for p, o in zip(jobs.prompt, jobs.output, strict=True) if p + o > longest)
    if too_long and note is not None:
        note(
            f"{too_long:,} of the level's {len(jobs):,} requests are longer than max_model_len "
            f"({longest:,} tokens): vLLM answers them 400, and so does the simulation"
        )
    sim = FleetSim(opts.spec, autoscaler=level_policy(opts.autoscaler, plan, jobs),
                   budget=opts.level_budget())  # fmt: skip
    return sim.run(plan, jobs, opts.slo, offsets=level_offsets(plan, jobs), progress=progress)


def level_policy(
    scaling: AutoscaleSetup | OracleSetup | None, plan: LoadPlan, jobs: JobTable | None
) -> AutoscalePolicy | None:
    """A fresh policy for the level; the oracle is told its schedule of sends, which only an
    open loop of requests made in advance (`jobs`) knows before the run."""
    if not isinstance(scaling, OracleSetup):
        return scaling.build() if scaling is not None else None
    offsets = level_offsets(plan, jobs) if jobs is not None else None
    if offsets is None or jobs is None:
        raise ConfigError(
            "--scaling-policy oracle is told the level's future rate, which only an open "
            "loop of requests known in advance has",
            hint="--rate R (with --duration), or --workload trace --trace FILE",
        )
    return scaling.build([slot.send_s for slot in open_slots(plan, len(jobs), offsets)])


def simulate(
    opts: SimOptions,
    on_level: Callable[[Load, LoadPlan], Callable[[Progress], None] | None] | None = None,
    on_done: Callable[[Run], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> SimOutput:
    """Run the levels; Ctrl-C after a finished level ends the run with the finished levels
    (`interrupted` set) instead of losing them (Ctrl-C before any finished still raises)."""
    runs: list[Run] = []
    stats: list[FleetStats] = []
    interrupted = False
    try:
        while (load := opts.levels.next_level(runs).load) is not None:
            progress = on_level(load, level_plan(opts, load)) if on_level is not None else None
            outcome = run_level(opts, len(runs), load, progress, note)
            # The field bench fills from the replicas' own counters: the same counts.
            run = outcome.run.model_copy(
                update={"prefix_cache_hit_rate": outcome.stats.prefix_hit_rate}
            )
            runs.append(run)
            stats.append(outcome.stats)
            if on_done is not None:
                on_done(run)
    except KeyboardInterrupt:
        finished = min(len(runs), len(stats))
        if not finished:
            raise
        runs, stats, interrupted = runs[:finished], stats[:finished], True
    slo = opts.slo.as_dict()
    result = BenchResult(
        source=Source.SIMULATED,
        target=opts.target | {"levels": [_stats_dict(s) for s in stats]},
        workload=describe(opts.levels.workload),
        slo=slo,
        runs=tuple(runs),
        sweet_spot=sweet_spot(runs, slo_set=bool(slo)) if len(runs) > 1 else None,
        interrupted=interrupted,
    )
    return SimOutput(result, tuple(stats))


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
        "replica_hours": round(stats.replica_s / 3600, 4),
        "replica_hours_asleep": round(stats.replica_asleep_s / 3600, 4),
        "wakes": stats.wakes,
        "scale_events": stats.scale_events,
        "wall_s": round(stats.wall_s, 2),
        # vLLM's request_queue_time and request_prefill_time, mean per measured request.
        "engine_queue_ms": _ms(stats.engine_queue_s),
        "engine_prefill_ms": _ms(stats.engine_prefill_s),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)
