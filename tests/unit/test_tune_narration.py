"""What `servepilot tune` says: its progress lines, its table cells and its verdict, with known
answers for synthetic trials."""

from __future__ import annotations

from servepilot.core.slo import parse_slo
from servepilot.tune import narration
from servepilot.tune.policy import Proposal, Stop, StopReason
from servepilot.tune.score import Failure, FailureCause, Measurement, Trial
from servepilot.tune.space import Knob, TrialConfig
from servepilot.tune.summary import summarize
from tests.unit.tune_support import run

SLA = parse_slo("ttft_p99_ms=1000")
DEFAULT = TrialConfig.of({Knob.MAX_NUM_SEQS: 8})
MORE = DEFAULT.with_value(Knob.MAX_NUM_SEQS, 16)
STOP = Stop(StopReason.BUDGET, "spent")


def trial(index: int, config: TrialConfig, *runs_: tuple[float, float, float]) -> Trial:
    runs = tuple(run(c, goodput, ttft_ms=ttft) for c, goodput, ttft in runs_)
    return Trial(index, config, Measurement(runs, 8, 0, None, 0.0), 2.25, "why")


def test_level_line_names_the_worst_statistic_and_the_verdict() -> None:
    assert narration.level_line(run(4, 1.5, ttft_ms=400), SLA) == (
        "  c=4: 1.500 req/s goodput, ttft_p99_ms 400 ms — meets the SLA"
    )
    assert narration.level_line(run(8, 0.0, ttft_ms=1500, failed=2), SLA) == (
        "  c=8: 0.000 req/s goodput, ttft_p99_ms 1,500 ms, 2 failed — misses the SLA"
    )


def test_trial_lines_say_what_changed_from_the_default() -> None:
    assert narration.trial_started_line(1, 3, Proposal(DEFAULT, "the plan"), DEFAULT) == (
        "trial 1/3: (default) — the plan"
    )
    assert narration.trial_started_line(2, 3, Proposal(MORE, "raise it"), DEFAULT) == (
        "trial 2/3: max_num_seqs=16 — raise it"
    )
    assert narration.pruned_line(MORE, "does not fit", DEFAULT) == (
        "  skipped max_num_seqs=16: does not fit"
    )


def test_a_measured_trial_reads_as_goodput_at_its_best_level() -> None:
    summary = summarize([trial(1, DEFAULT, (2, 1.8, 500), (4, 2.5, 1500))], SLA, DEFAULT, STOP)
    row = summary.rows[0]
    assert narration.result_text(row).startswith("1.800 req/s at c=2 (meets SLA; ")
    assert narration.trial_finished_line(row, 3, resumed=False).startswith("  -> 1.800 req/s")
    assert narration.trial_finished_line(row, 3, resumed=True).startswith(
        "trial 1/3 (from trials.jsonl) 1.800 req/s at c=2"
    )
    cells = narration.table_cells(row)
    assert len(cells) == len(narration.TABLE_COLUMNS)
    assert cells[:5] == ("1", "(default)", "meets SLA", "1.800", "c=2")
    assert cells[5] == "ttft_p99_ms 1.50x" and cells[-1] == "2.2"


def test_a_failed_trial_reads_as_its_cause() -> None:
    crashed = Trial(2, MORE, Failure(FailureCause.CRASHED, "out of memory"), 1.0, "raise")
    row = summarize([crashed], SLA, DEFAULT, STOP).rows[0]
    assert narration.result_text(row) == "failed: crashed: out of memory"
    assert narration.table_cells(row)[3:6] == ("—", "—", "—")


def test_verdict_names_the_best_and_its_gain_over_the_default() -> None:
    trials = [trial(1, DEFAULT, (2, 1.0, 500)), trial(2, MORE, (2, 1.5, 500))]
    found = narration.verdict(summarize(trials, SLA, DEFAULT, STOP))
    assert found.met and found.head == "best: trial 2, max_num_seqs=16: "
    assert found.text == "1.500 req/s at the SLA, +50.0% over the default"
    alone = narration.verdict(summarize(trials[:1], SLA, DEFAULT, STOP))
    assert alone.head == "best: trial 1, the planner's default: "


def test_verdict_without_a_trial_meeting_the_sla_names_the_binding_slo() -> None:
    trials = [trial(1, DEFAULT, (1, 0.5, 1500)), trial(2, MORE, (1, 0.5, 1200))]
    found = narration.verdict(summarize(trials, SLA, DEFAULT, STOP))
    assert not found.met and found.head == ""
    assert found.text == (
        "no configuration met the SLA (ttft_p99_ms=1000); best effort: trial 2; ttft_p99_ms "
        "binds: 1,200 ms against 1,000 ms at best"
    )


def test_a_search_is_summarized_with_its_incumbent_not_a_noisy_winner() -> None:
    from servepilot.tune.policy import Goal
    from servepilot.tune.search import SearchResult
    from servepilot.tune.summary import summarize_search
    from tests.unit.tune_support import two_knob_space

    space = two_knob_space()
    more = space.default.with_value(Knob.MAX_NUM_SEQS, 256)
    trials = (trial(1, space.default, (2, 1.0, 500)), trial(2, more, (2, 1.01, 500)))
    pruned = ((more, "why"),)
    found = summarize_search(space, Goal(SLA, 4), SearchResult(trials, STOP, 1, pruned))
    # Trial 2 is 1% better: within the 2% of noise, so the default stays the best.
    assert found.best is not None and found.best.trial.index == 1
    assert (found.resumed, found.pruned, found.stop) == (1, 1, STOP)
    noisy = summarize(trials, SLA, space.default, STOP).best
    assert noisy is not None and noisy.trial.index == 2


def test_a_search_is_told_line_by_line_as_it_goes() -> None:
    from types import SimpleNamespace

    from servepilot.tune.policy import Goal
    from tests.unit.tune_support import two_knob_space

    space = two_knob_space()
    sla = parse_slo("ttft_p99_ms=500")
    from servepilot.core.config import EngineKind

    goal = Goal(sla=sla, budget_trials=5)
    setup = SimpleNamespace(engine=EngineKind.SIM, space=SimpleNamespace(space=space), goal=goal)
    said: list[str] = []
    events = narration.search_events(setup, said.append)  # type: ignore[arg-type]
    assert said == [narration.start_line(setup), *space.notes]  # type: ignore[arg-type]
    proposal = Proposal(config=space.default, reason="the planner's default")
    events.started(1, proposal)
    events.pruned(space.default, "cannot change the result")
    assert said[-2] == narration.trial_started_line(1, 5, proposal, space.default)
    assert said[-1] == narration.pruned_line(space.default, "cannot change the result",
                                             space.default)  # fmt: skip
