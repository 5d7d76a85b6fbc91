"""One `servepilot bench` invocation: levels (given or swept), soak, then the result.

I/O lives here and in the runner; the decisions (next sweep level, sweet spot) and the numbers
(metrics) are pure functions imported from their modules.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from servepilot.bench.agentic import AgenticTexts, make_texts, run_agentic
from servepilot.bench.chat_template import ChatFrame, count_gap_note
from servepilot.bench.client import Target
from servepilot.bench.console import estimate_line
from servepilot.bench.drive import ProgressFn
from servepilot.bench.metrics import summarize
from servepilot.bench.prefix_cache import hit_rate, read_cache
from servepilot.bench.records import RequestRecord, RequestSpec
from servepilot.bench.runlength import (
    Estimate,
    Pace,
    estimate,
    first_answers_pace,
    level_pace,
    run_loads,
)
from servepilot.bench.runner import LoadInterrupted, LoadOutcome, ended_by, run_load
from servepilot.bench.soak import (
    MemorySample,
    MemorySampler,
    finished_windows,
    sample_every,
    sample_memory,
    with_soak,
)
from servepilot.bench.tokenizer import Tokenizer
from servepilot.bench.workload import build_workload
from servepilot.core.loop import cancel_and_wait
from servepilot.core.results import BenchResult, Load, Run, Source
from servepilot.core.slo import Slo
from servepilot.load.levels import LevelOptions, pool_size
from servepilot.load.loadplan import LoadPlan
from servepilot.load.sweep import sweet_spot
from servepilot.load.workload import WorkloadKind, WorkloadSpec, describe


@dataclass(frozen=True, slots=True)
class BenchOptions:
    target: Target
    levels: LevelOptions
    seed: int
    """The arrival schedule's seed."""
    slo: Slo
    soak_s: float | None = None
    window_s: float = 30.0
    processes: int | None = None
    metrics_url: str | None = None
    chat: ChatFrame = field(default_factory=ChatFrame)
    """What the chat template adds to a message, taken off each message's text."""
    memory_sources: MemorySampler | None = None
    """Soak: memory beyond the target's /metrics (a local fleet's replica processes and
    GPUs), sampled with it at every window's end."""


@dataclass(frozen=True, slots=True)
class LevelProgress:
    load: Load
    completed: int
    failed: int
    elapsed_s: float
    planned: int | None
    planned_s: float | None
    left_s: tuple[float, float] | None = None
    """What is left of the whole run, in seconds (the short and the long end of the
    estimate); None while unknown."""


class BenchReporter:
    """Callbacks the CLI turns into a progress bar and lines."""

    def __init__(
        self,
        level_started: Callable[[Load, int | None, float | None], None],
        progress: Callable[[LevelProgress], None],
        level_done: Callable[[Run], None],
        note: Callable[[str], None],
    ) -> None:
        self.level_started = level_started
        self.progress = progress
        self.level_done = level_done
        self.note = note


class RunClock:
    """The run's length as it becomes known: noted before the first request, once the first
    answer is in, and after every level; each progress report carries what is left."""

    def __init__(self, opts: BenchOptions, report: BenchReporter) -> None:
        self._loads = run_loads(opts.levels)
        self._plans = [_plan(opts, load) for load in self._loads]
        self._sweep = opts.levels.sweep is not None
        self._report = report
        self._pace: Pace | None = None
        self._done = 0

    def start(self) -> None:
        self._note()

    def progress(
        self, plan: LoadPlan, answers: int, elapsed_s: float
    ) -> tuple[float, float] | None:
        """What is left of the run, `elapsed_s` into the level of `plan` with `answers` in."""
        if self._pace is None and answers and elapsed_s > 0:
            known = self._estimate(self._plans).left_s is not None
            self._pace = first_answers_pace(plan, elapsed_s)
            if not known:  # the first estimate with a time in it
                self._note()
        plans = [*self._plans[: self._done], plan, *self._plans[self._done + 1 :]]
        left = self._estimate(plans, (answers, elapsed_s))
        if left.short_s is None or left.left_s is None:
            return None
        return left.short_s, left.left_s

    def level_done(self, run: Run, sent: int, wall_s: float) -> None:
        self._done += 1
        self._pace = level_pace(run, sent, wall_s)
        if self._done < len(self._plans):
            self._note()

    def _note(self) -> None:
        self._report.note(estimate_line(self._estimate(self._plans), self._plans, self._loads))

    def _estimate(
        self, plans: Sequence[LoadPlan], running: tuple[int, float] | None = None
    ) -> Estimate:
        return estimate(plans, self._done, self._pace, sweep=self._sweep, running=running)


def _plan(opts: BenchOptions, load: Load) -> LoadPlan:
    return opts.levels.plan(load, seed=opts.seed, soak_s=opts.soak_s, processes=opts.processes)


@dataclass(frozen=True, slots=True)
class BenchOutput:
    result: BenchResult
    records: tuple[tuple[Load, RequestRecord], ...]


async def run_bench(opts: BenchOptions, tokenizer: Tokenizer, report: BenchReporter) -> BenchOutput:
    """Run the levels. Ctrl-C after a finished level (or a soak's finished window) ends the run
    with what finished (the result marked `interrupted`); before anything finished, it stops
    the command as usual."""
    runs: list[Run] = []
    records: list[tuple[Load, RequestRecord]] = []
    interrupted = False
    try:
        reason = await _run_levels(opts, tokenizer, report, runs, records)
    except asyncio.CancelledError:
        if not runs:
            raise
        interrupted = True
        if opts.soak_s is None:
            report.note(f"interrupted: keeping the finished levels ({len(runs)})")
    else:
        if opts.levels.sweep is not None:
            report.note(f"sweep stopped: {reason}")
    slo = opts.slo.as_dict()
    result = BenchResult(
        source=Source.MEASURED,
        target={
            "url": opts.target.base_url,
            "model": opts.target.model,
            "endpoint": opts.target.endpoint.value,
            **opts.chat.as_target(opts.target.endpoint),
        },
        workload=describe(opts.levels.workload),
        slo=slo,
        runs=tuple(runs),
        sweet_spot=sweet_spot(runs, slo_set=bool(slo)) if len(runs) > 1 else None,
        interrupted=interrupted,
    )
    return BenchOutput(result=result, records=tuple(records))


async def _run_levels(
    opts: BenchOptions,
    tokenizer: Tokenizer,
    report: BenchReporter,
    runs: list[Run],
    records: list[tuple[Load, RequestRecord]],
) -> str:
    """Run level after level, appending each finished one to `runs` and `records` (so they
    survive an interruption); the reason the levels ended."""
    levels = opts.levels
    clock = RunClock(opts, report)
    clock.start()
    while (step := levels.next_level(runs)).load is not None:
        load = step.load
        plan = _plan(opts, load)
        started_s = time.perf_counter()
        workload, send = await _level_load(opts, plan, levels.level_workload(len(runs)), tokenizer)
        cache_before = await read_cache(opts.target.base_url)
        report.level_started(load, plan.max_requests, plan.duration_s)
        memory: list[MemorySample] = []
        try:
            outcome = await _run_level(opts, plan, send, report, clock, memory)
        except LoadInterrupted as cut:
            if opts.soak_s is not None:
                _keep_finished_windows(opts, load, cut, memory, (runs, records), report)
            raise
        run = _level_done(opts, load, workload, outcome, memory, report)
        cached = hit_rate(cache_before, await read_cache(opts.target.base_url))
        run = run.model_copy(update={"prefix_cache_hit_rate": cached})
        _note_warm_cache(opts.levels.workload, cached, report)
        records += [(load, r) for r in outcome.records]
        runs.append(run)
        report.level_done(run)
        clock.level_done(run, len(outcome.records), time.perf_counter() - started_s)
    return step.reason


Send = Callable[[ProgressFn], Awaitable[LoadOutcome]]
"""Runs a level's load, reporting progress."""

WARM_CACHE_RATE = 0.05
"""A workload of new prompts served more than this from the prefix cache gets a warning."""
_NEW_PROMPTS = (WorkloadKind.RANDOM, WorkloadKind.MIXED, WorkloadKind.TRACE)
"""The workloads whose prompts share nothing: their cache hits are an earlier run's."""


def _note_warm_cache(spec: WorkloadSpec, rate: float | None, report: BenchReporter) -> None:
    if rate is None or rate <= WARM_CACHE_RATE or spec.kind not in _NEW_PROMPTS:
        return
    report.note(
        f"the replicas served {rate:.0%} of this level's prompt tokens from their prefix "
        f"cache: an earlier bench with --seed {spec.seed} sent the same prompts, so its TTFT and "
        "throughput are not those of new traffic. Pass another --seed (or restart the "
        "replicas) for a cold cache"
    )


async def _level_load(
    opts: BenchOptions, plan: LoadPlan, spec: WorkloadSpec, tokenizer: Tokenizer
) -> tuple[Sequence[RequestSpec], Send]:
    """The level's requests (made here, in a thread: the tokenizer may block) and what sends
    them. The agentic workload has no list: each turn carries the answer before it."""
    chat_tokens = opts.chat.overhead_tokens
    if spec.kind is WorkloadKind.AGENTIC:
        make = functools.partial(make_texts, chat_template_tokens=chat_tokens)
        texts = await asyncio.to_thread(make, spec, tokenizer)
        return (), functools.partial(_send_agentic, opts.target, plan, spec, texts)
    make_list = functools.partial(build_workload, chat_template_tokens=chat_tokens)
    workload = await asyncio.to_thread(make_list, spec, tokenizer, pool_size(plan))
    return workload, functools.partial(_send_list, opts.target, plan, workload)


async def _send_list(
    target: Target, plan: LoadPlan, workload: Sequence[RequestSpec], progress: ProgressFn
) -> LoadOutcome:
    return await run_load(target, plan, workload, on_progress=progress)


async def _send_agentic(
    target: Target, plan: LoadPlan, spec: WorkloadSpec, texts: AgenticTexts, progress: ProgressFn
) -> LoadOutcome:
    return await run_agentic(target, plan, spec, texts, on_progress=progress)


def _level_done(
    opts: BenchOptions,
    load: Load,
    workload: Sequence[RequestSpec],
    outcome: LoadOutcome,
    memory: Sequence[MemorySample],
    report: BenchReporter,
) -> Run:
    """The run of a finished level, with what the user should know about its answers."""
    if outcome.no_usage:
        report.note(
            f"{outcome.no_usage} answers carried no token usage: output tokens were "
            "counted as streamed chunks (enable stream_options.include_usage on the server)"
        )
    gap = count_gap_note(opts.chat, opts.target.endpoint, workload, outcome.records)
    if gap is not None:
        report.note(gap)
    run = _level_run(opts, load, outcome)
    if opts.soak_s is not None:
        run = with_soak(run, outcome.records, opts.window_s, memory)
    return run


def _keep_finished_windows(
    opts: BenchOptions,
    load: Load,
    cut: LoadInterrupted,
    memory: Sequence[MemorySample],
    into: tuple[list[Run], list[tuple[Load, RequestRecord]]],
    report: BenchReporter,
) -> None:
    """A soak cut short keeps its finished windows as its run: the requests that ended in
    them, and the memory sampled at their ends (memory[0] is the start)."""
    done, end_s = finished_windows(cut.outcome.records, opts.window_s, cut.stopped_s)
    if done == 0:
        report.note("interrupted before the soak's first window finished: nothing to keep")
        return
    outcome = ended_by(cut.outcome, end_s)
    run = with_soak(_level_run(opts, load, outcome), outcome.records, opts.window_s,
                    memory[: done + 1])  # fmt: skip
    runs, records = into
    records += [(load, r) for r in outcome.records]
    runs.append(run)
    report.note(f"interrupted: keeping the soak's {done} finished window{'s' if done != 1 else ''}")


def _level_run(opts: BenchOptions, load: Load, outcome: LoadOutcome) -> Run:
    run = summarize(
        load, outcome.records, opts.slo, duration_s=outcome.duration_s, client=outcome.client
    )
    return run.model_copy(
        update={
            "retry_wait_s": outcome.retry_wait_s,
            "peak_in_flight": outcome.peak_in_flight,
            "load_reached": outcome.load_reached,
        }
    )


async def _run_level(
    opts: BenchOptions,
    plan: LoadPlan,
    send: Send,
    report: BenchReporter,
    clock: RunClock,
    memory: list[MemorySample],
) -> LoadOutcome:
    """Run one level; a soak also samples memory into `memory` (kept by the caller, so that a
    soak cut short still has the samples of its finished windows)."""

    def progress(completed: int, failed: int, elapsed_s: float) -> None:
        left_s = clock.progress(plan, completed + failed, elapsed_s)
        report.progress(
            LevelProgress(
                plan.load, completed, failed, elapsed_s, plan.max_requests, plan.duration_s, left_s
            )
        )

    if opts.soak_s is None:
        return await send(progress)
    url = _metrics_url(opts)
    sampler = asyncio.ensure_future(sample_every(url, opts.memory_sources, opts.window_s, memory))
    try:
        outcome = await send(progress)
    except BaseException:
        sampler.cancel()
        # Not cancel_and_wait: under a cancellation it raises a plain CancelledError, which
        # would replace a LoadInterrupted and the finished requests it carries.
        await asyncio.wait([sampler])
        raise
    await cancel_and_wait(sampler)
    memory.append(await sample_memory(url, opts.memory_sources))
    return outcome


def _metrics_url(opts: BenchOptions) -> str:
    return opts.metrics_url or f"{opts.target.base_url}/metrics"
