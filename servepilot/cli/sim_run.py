"""`servepilot sim` in the terminal: a progress bar per level, then the table and the files.

What runs is `sim.fleet.session.simulate`; this module only shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.text import Text

from servepilot.bench.outputs import write_results_json
from servepilot.cli.console import print_step
from servepilot.cli.levels_view import fmt_load, level_bars, print_runs
from servepilot.core.results import Load
from servepilot.load.loadplan import LoadPlan
from servepilot.sim.fleet.records import Progress
from servepilot.sim.fleet.session import SimOptions, SimOutput, simulate


def run_with_progress(opts: SimOptions) -> SimOutput:
    with level_bars() as bars:

        def started(load: Load, plan: LoadPlan) -> Callable[[Progress], None]:
            by_count = plan.max_requests is not None
            total = (plan.max_requests or 0) + plan.warmup_requests if by_count else None
            bars.start(load, total or plan.duration_s)

            def progress(p: Progress) -> None:
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
