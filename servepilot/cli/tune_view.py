"""`servepilot tune` in the terminal: progress, the trials table, the verdict."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from servepilot.bench.report.fmt import format_load
from servepilot.cli.console import out_console, print_step, print_warning, simple_table
from servepilot.core.results import Run
from servepilot.core.slo import Slo
from servepilot.tune.artifacts import fleet_command, tuned_fleet, write_artifacts
from servepilot.tune.policy import Proposal, Stop, StopReason, incumbent
from servepilot.tune.score import Trial
from servepilot.tune.search import SearchEvents, SearchResult, run_search
from servepilot.tune.setup import TuneSetup
from servepilot.tune.sla import meets, worst
from servepilot.tune.space import TrialConfig
from servepilot.tune.summary import Summary, TrialRow, summarize

_NO_STOP = Stop(StopReason.CONVERGED, "")


def search(setup: TuneSetup) -> SearchResult:
    space = setup.space.space
    budget = setup.goal.budget_trials
    print_step(
        f"tuning on {setup.engine.value}: {len(space.axes)} knob(s) "
        f"({', '.join(space.knobs) or 'none'}), up to {budget} trials; "
        f"SLA {setup.goal.sla.describe()}"
    )
    for note in space.notes:
        print_step(note)

    def started(index: int, proposal: Proposal) -> None:
        what = proposal.config.describe(against=space.default)
        what = "(default)" if proposal.config == space.default else what
        print_step(f"trial {index}/{budget}: {what} — {proposal.reason}")

    def finished(trial: Trial, resumed: bool) -> None:
        row = summarize([trial], setup.goal.sla, space.default, _NO_STOP).rows[0]
        head = f"trial {trial.index}/{budget} (from trials.jsonl)" if resumed else "  ->"
        print_step(f"{head} {_result_text(row)}")

    def pruned(config: TrialConfig, why: str) -> None:
        print_step(f"  skipped {config.describe(against=space.default)}: {why}")

    events = SearchEvents(started, finished, pruned)
    return run_search(space, setup.goal, setup.runner, setup.store, events)


def report(setup: TuneSetup, result: SearchResult) -> int:
    space = setup.space.space
    best = incumbent(space, result.trials, setup.goal)
    summary = summarize(
        result.trials, setup.goal.sla, space.default, result.stop,
        resumed=result.resumed, pruned=len(result.pruned),
        chosen=best.trial.index if best is not None else None,
    )  # fmt: skip
    out_console.print(_table(summary))
    print_step(f"search stopped: {result.stop.detail}")
    chosen = summary.chosen
    if chosen is None:
        print_warning("no trial could be measured: nothing to write")
        return 1
    fleet = tuned_fleet(setup, chosen.trial)
    command = fleet_command(fleet)
    _verdict(summary)
    write_artifacts(setup, summary, fleet, command)
    out_console.print(f"vLLM command: {command}", soft_wrap=True)
    print_step(f"wrote {setup.out}/fleet.yaml, vllm_command.txt, report.html and trials.jsonl")
    return 0 if summary.met else 1


def level_line(run: Run, sla: Slo) -> str:
    """One measured load level of a trial, against the SLA."""
    found = worst(run, sla)
    limit = f"{found.key} {found.observed_ms:,.0f} ms" if found is not None else "no latency"
    verdict = "meets the SLA" if meets(run, sla) else "misses the SLA"
    failed = f", {run.failed} failed" if run.failed else ""
    return (
        f"  {format_load(run.load)}: {run.goodput_rps:.3f} req/s goodput, {limit}{failed} "
        f"— {verdict}"
    )


def _changes(row: TrialRow) -> str:
    return "the planner's default" if row.changes == "(default)" else row.changes


def _verdict(summary: Summary) -> None:
    best = summary.best
    if best is not None and best.score is not None:
        out_console.print(
            Text(f"best: trial {best.trial.index}, {_changes(best)}: ", style="bold green")
            + Text(f"{best.score.goodput_rps:.3f} req/s at the SLA, {summary.gain_text}")
        )
        return
    binding = summary.binding
    effort = summary.best_effort
    print_warning(
        f"no configuration met the SLA ({summary.sla.describe()}); best effort: trial "
        f"{effort.trial.index if effort else '?'}"
        + (
            f"; {binding.key} binds: {binding.observed_ms:,.0f} ms against "
            f"{binding.limit_ms:,.0f} ms at best"
            if binding is not None
            else ""
        )
    )


def _table(summary: Summary) -> Table:
    columns = ("#", "changes from the default", "status", "goodput req/s", "best level",
               "binding SLO", "signals / failure", "wall s")  # fmt: skip
    table = simple_table(
        "servepilot tune: trials", columns, (), right=("#", "goodput req/s", "wall s"),
        box=box.SIMPLE_HEAD, caption=f"SLA {summary.sla.describe()}", caption_justify="left",
    )  # fmt: skip
    chosen = summary.chosen
    for row in summary.rows:
        spot = chosen is not None and row.trial.index == chosen.trial.index
        table.add_row(*_cells(row), style="bold green" if spot else None)
    return table


def _cells(row: TrialRow) -> tuple[str, ...]:
    return (str(row.trial.index), row.changes, row.status, row.goodput_text, row.level_text,
            row.binding_text, row.signals, f"{row.trial.wall_s:,.1f}")  # fmt: skip


def _result_text(row: TrialRow) -> str:
    score = row.score
    if score is None:
        return f"{row.status}: {row.signals}"
    level = f" at {format_load(score.best.load)}" if score.best is not None else ""
    return f"{score.goodput_rps:.3f} req/s{level} ({row.status}; {row.signals})"
