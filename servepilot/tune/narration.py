"""What `servepilot tune` says, as text: the lines it prints while it searches, the cells of its
trials table and its verdict. A terminal draws them (cli/tune_cmd.py); the wording is here,
beside the summary it reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servepilot.bench.report.fmt import format_load
from servepilot.core.results import Run
from servepilot.core.slo import Slo
from servepilot.tune.policy import Proposal
from servepilot.tune.score import Trial
from servepilot.tune.search import SearchEvents
from servepilot.tune.setup import TuneSetup
from servepilot.tune.sla import meets, worst
from servepilot.tune.space import TrialConfig
from servepilot.tune.summary import Summary, TrialRow, trial_row

TABLE_COLUMNS = (
    "#",
    "changes from the default",
    "status",
    "goodput req/s",
    "best level",
    "binding SLO",
    "signals / failure",
    "wall s",
)
RIGHT_COLUMNS = ("#", "goodput req/s", "wall s")


@dataclass(frozen=True, slots=True)
class Verdict:
    met: bool
    head: str
    """When met: which trial is best (a terminal may set it apart); "" when not."""
    text: str
    """When met: its goodput and gain; when not: the best effort and the SLO that binds."""


def start_line(setup: TuneSetup) -> str:
    space = setup.space.space
    return (
        f"tuning on {setup.engine.value}: {len(space.axes)} knob(s) "
        f"({', '.join(space.knobs) or 'none'}), up to {setup.goal.budget_trials} trials; "
        f"SLA {setup.goal.sla.describe()}"
    )


def trial_started_line(index: int, budget: int, proposal: Proposal, default: TrialConfig) -> str:
    what = proposal.config.describe(against=default)
    what = "(default)" if proposal.config == default else what
    return f"trial {index}/{budget}: {what} — {proposal.reason}"


def trial_finished_line(row: TrialRow, budget: int, resumed: bool) -> str:
    head = f"trial {row.trial.index}/{budget} (from trials.jsonl)" if resumed else "  ->"
    return f"{head} {result_text(row)}"


def pruned_line(config: TrialConfig, why: str, default: TrialConfig) -> str:
    return f"  skipped {config.describe(against=default)}: {why}"


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


def result_text(row: TrialRow) -> str:
    """A trial's outcome in one phrase: its goodput and best level, or why it failed."""
    score = row.score
    if score is None:
        return f"{row.status}: {row.signals}"
    level = f" at {format_load(score.best.load)}" if score.best is not None else ""
    return f"{score.goodput_rps:.3f} req/s{level} ({row.status}; {row.signals})"


def table_cells(row: TrialRow) -> tuple[str, ...]:
    """A row of the trials table, in the order of TABLE_COLUMNS."""
    return (
        str(row.trial.index),
        row.changes,
        row.status,
        row.goodput_text,
        row.level_text,
        row.binding_text,
        row.signals,
        f"{row.trial.wall_s:,.1f}",
    )


def verdict(summary: Summary) -> Verdict:
    best = summary.best
    if best is not None and best.score is not None:
        changes = "the planner's default" if best.changes == "(default)" else best.changes
        head = f"best: trial {best.trial.index}, {changes}: "
        return Verdict(
            True, head, f"{best.score.goodput_rps:.3f} req/s at the SLA, {summary.gain_text}"
        )
    binding = summary.binding
    effort = summary.best_effort
    text = (
        f"no configuration met the SLA ({summary.sla.describe()}); best effort: trial "
        f"{effort.trial.index if effort else '?'}"
    )
    if binding is not None:
        text += (
            f"; {binding.key} binds: {binding.observed_ms:,.0f} ms against "
            f"{binding.limit_ms:,.0f} ms at best"
        )
    return Verdict(False, "", text)


def search_events(setup: TuneSetup, say: Callable[[str], None]) -> SearchEvents:
    """The search told as lines to `say`: its start and the space's notes at once, then a
    line for each trial started, finished (or found in trials.jsonl) and pruned."""
    space, goal = setup.space.space, setup.goal
    say(start_line(setup))
    for note in space.notes:
        say(note)

    def started(index: int, proposal: Proposal) -> None:
        say(trial_started_line(index, goal.budget_trials, proposal, space.default))

    def finished(trial: Trial, resumed: bool) -> None:
        row = trial_row(trial, goal.sla, space.default)
        say(trial_finished_line(row, goal.budget_trials, resumed))

    def pruned(config: TrialConfig, why: str) -> None:
        say(pruned_line(config, why, space.default))

    return SearchEvents(started, finished, pruned)
