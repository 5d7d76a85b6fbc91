"""What a tuning run found: every trial as a row, the best one, the gain over the default.

The best trial is the search's incumbent when it is given (`chosen`: a trial replaced the
best only by beating it by more than the minimum gain, so noise does not pick the winner),
else the one with the most goodput at the SLA (the earliest of equals). When no trial met
the SLA there is no best, only a best effort: the trial that came closest (the smallest
worst observed/limit ratio), and the SLO that binds there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.bench.report.fmt import format_load
from servepilot.core.slo import Slo
from servepilot.tune.policy import Goal, Stop, incumbent
from servepilot.tune.score import Failure, Measurement, Score, Trial, diagnose, score
from servepilot.tune.search import SearchResult
from servepilot.tune.sla import Violation
from servepilot.tune.space import SearchSpace, TrialConfig


@dataclass(frozen=True, slots=True)
class TrialRow:
    trial: Trial
    score: Score | None
    """None for a failed trial."""
    changes: str
    """What differs from the default configuration."""
    signals: str
    """The diagnosis of its metrics, or the failure's cause."""

    @property
    def status(self) -> str:
        if isinstance(self.trial.outcome, Failure):
            return f"failed: {self.trial.outcome.cause.value}"
        return "meets SLA" if self.score is not None and self.score.met else "misses SLA"

    # The cells the terminal's table and the HTML report's share ("—" where not measured).
    @property
    def goodput_text(self) -> str:
        return f"{self.score.goodput_rps:.3f}" if self.score is not None else "—"

    @property
    def level_text(self) -> str:
        best = self.score.best if self.score is not None else None
        return format_load(best.load) if best is not None else "—"

    @property
    def binding_text(self) -> str:
        binding = self.score.binding if self.score is not None else None
        return f"{binding.key} {binding.ratio:.2f}x" if binding is not None else "—"


@dataclass(frozen=True, slots=True)
class Summary:
    sla: Slo
    rows: tuple[TrialRow, ...]
    stop: Stop
    default: TrialRow | None
    """The trial of the planner's configuration, if it ran."""
    best: TrialRow | None
    """The best trial that met the SLA; None when none did."""
    best_effort: TrialRow | None
    """When none met it: the trial that came closest."""
    resumed: int
    pruned: int

    @property
    def met(self) -> bool:
        return self.best is not None

    @property
    def chosen(self) -> TrialRow | None:
        return self.best or self.best_effort

    @property
    def gain(self) -> float | None:
        """Best goodput over the default's, minus 1 (None when the default scored 0)."""
        if self.best is None or self.default is None or self.default.score is None:
            return None
        base = self.default.score.goodput_rps
        assert self.best.score is not None
        return self.best.score.goodput_rps / base - 1.0 if base > 0 else None

    @property
    def gain_text(self) -> str:
        gain = self.gain
        return f"{gain:+.1%} over the default" if gain is not None else "the default met none"

    @property
    def binding(self) -> Violation | None:
        row = self.chosen
        return row.score.binding if row is not None and row.score is not None else None


def summarize(
    trials: Sequence[Trial],
    sla: Slo,
    default: TrialConfig,
    stop: Stop,
    *,
    resumed: int = 0,
    pruned: int = 0,
    chosen: int | None = None,
) -> Summary:
    """`chosen`: the index of the search's incumbent, if the caller knows it."""
    rows = tuple(trial_row(t, sla, default) for t in trials)
    measured = [r for r in rows if r.score is not None]
    meeting = [r for r in measured if r.score is not None and r.score.met]
    best = max(meeting, key=_goodput, default=None)
    best_effort = None
    if best is None and measured:
        best_effort = min(measured, key=lambda r: (_closeness(r), r.trial.index))
    pick = next((r for r in measured if r.trial.index == chosen), None)
    if pick is not None and pick.score is not None:
        best, best_effort = (pick, None) if pick.score.met else (None, pick)
    default_row = next((r for r in rows if r.trial.config == default), None)
    return Summary(sla, rows, stop, default_row, best, best_effort, resumed, pruned)


def summarize_search(space: SearchSpace, goal: Goal, result: SearchResult) -> Summary:
    """A search's trials, its incumbent as the chosen one."""
    best = incumbent(space, result.trials, goal)
    return summarize(
        result.trials,
        goal.sla,
        space.default,
        result.stop,
        resumed=result.resumed,
        pruned=len(result.pruned),
        chosen=best.trial.index if best is not None else None,
    )


def trial_row(trial: Trial, sla: Slo, default: TrialConfig) -> TrialRow:
    changes = "(default)" if trial.config == default else trial.config.describe(against=default)
    if isinstance(trial.outcome, Failure):
        return TrialRow(trial, None, changes, trial.outcome.detail)
    assert isinstance(trial.outcome, Measurement)
    result = score(trial.outcome, sla)
    return TrialRow(trial, result, changes, diagnose(trial.outcome, result, sla).describe())


def _goodput(row: TrialRow) -> tuple[float, int]:
    assert row.score is not None
    return row.score.goodput_rps, -row.trial.index


def _closeness(row: TrialRow) -> float:
    assert row.score is not None
    return row.score.closeness
