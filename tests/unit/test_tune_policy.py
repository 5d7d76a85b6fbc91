"""`servepilot tune`'s search: known optima, failures, budget, resume, an impossible SLA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servepilot.core.slo import parse_slo
from servepilot.tune.policy import Goal, Proposal, Stop, StopReason, decide
from servepilot.tune.score import Failure, FailureCause, Measurement, Outcome, Trial
from servepilot.tune.search import SearchEvents, SearchResult, run_search
from servepilot.tune.space import Axis, Knob, SearchSpace, TrialConfig
from servepilot.tune.store import TrialStore
from servepilot.tune.summary import summarize
from tests.unit.tune_support import SurfaceRunner, peak, run, two_knob_space

SLA = parse_slo("ttft_p99_ms=1000,tpot_p99_ms=50")
QUIET = SearchEvents(lambda i, p: None, lambda t, r: None, lambda c, w: None)


def _search(
    space: SearchSpace, runner: SurfaceRunner, tmp_path: Path, budget: int = 30
) -> SearchResult:
    store = TrialStore(tmp_path / "trials.jsonl", "ctx")
    return run_search(space, Goal(SLA, budget), runner, store, QUIET)


def _best(result: SearchResult) -> TrialConfig:
    summary = summarize(result.trials, SLA, result.trials[0].config, result.stop)
    assert summary.best is not None
    return summary.best.trial.config


def _at(seqs: int, batched: int) -> TrialConfig:
    return TrialConfig.of({Knob.MAX_NUM_SEQS: seqs, Knob.MAX_NUM_BATCHED_TOKENS: batched})


@pytest.mark.parametrize(("seqs", "batched"), [(128, 2048), (4, 256), (512, 8192)])
def test_finds_the_known_optimum_from_any_start(tmp_path: Path, seqs: int, batched: int) -> None:
    runner = SurfaceRunner()
    result = _search(two_knob_space(seqs, batched), runner, tmp_path)
    assert result.stop.reason is StopReason.CONVERGED
    assert _best(result) == _at(48, 1024)
    # The grid holds 10 x 13 points; the search needs a fraction of them.
    assert len(runner.ran) <= 20


def test_first_trial_is_the_planner_default_and_gain_is_against_it(tmp_path: Path) -> None:
    result = _search(two_knob_space(), SurfaceRunner(), tmp_path)
    assert result.trials[0].config == _at(128, 2048)
    assert "default" in result.trials[0].reason
    summary = summarize(result.trials, SLA, _at(128, 2048), result.stop)
    assert summary.default is not None and summary.default.trial.index == 1
    assert summary.gain == pytest.approx(peak(48, 1024) / peak(128, 2048) - 1)


def test_never_proposes_what_the_planner_refuses(tmp_path: Path) -> None:
    space = two_knob_space(128, 128)
    runner = SurfaceRunner()
    result = _search(space, runner, tmp_path)
    assert all(space.check(config) is None for config in runner.ran)
    assert any("max_num_batched_tokens < max_num_seqs" in why for _, why in result.pruned)


def test_each_configuration_runs_once(tmp_path: Path) -> None:
    runner = SurfaceRunner()
    _search(two_knob_space(), runner, tmp_path)
    assert len({c.key for c in runner.ran}) == len(runner.ran)


def test_budget_stops_the_search(tmp_path: Path) -> None:
    runner = SurfaceRunner()
    result = _search(two_knob_space(), runner, tmp_path, budget=3)
    assert len(runner.ran) == 3
    assert result.stop.reason is StopReason.BUDGET


def test_resume_skips_finished_trials(tmp_path: Path) -> None:
    first = SurfaceRunner()
    done = _search(two_knob_space(), first, tmp_path, budget=4)
    assert len(first.ran) == 4
    second = SurfaceRunner()
    resumed = _search(two_knob_space(), second, tmp_path)
    assert resumed.resumed == 4
    assert second.ran[0] not in {t.config for t in done.trials}
    assert [t.config for t in resumed.trials[:4]] == [t.config for t in done.trials]
    again = SurfaceRunner()
    final = _search(two_knob_space(), again, tmp_path)
    assert again.ran == []
    assert len(final.trials) == len(resumed.trials)


def test_interrupted_search_keeps_the_finished_trials(tmp_path: Path) -> None:
    class Interrupt(SurfaceRunner):
        def run(self, config: TrialConfig) -> Outcome:
            if len(self.ran) == 2:
                raise KeyboardInterrupt
            return super().run(config)

    with pytest.raises(KeyboardInterrupt):
        _search(two_knob_space(), Interrupt(), tmp_path)
    lines = (tmp_path / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 2
    again = SurfaceRunner()
    assert _search(two_knob_space(), again, tmp_path).resumed == 2


def test_failed_trial_is_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    def oom(config: TrialConfig) -> Outcome | None:
        if int(config.get(Knob.MAX_NUM_SEQS)) > 128:
            return Failure(FailureCause.OUT_OF_MEMORY, "KV cache is needed, larger than ...")
        return None

    result = _search(two_knob_space(), SurfaceRunner(fail=oom), tmp_path)
    failed = [t for t in result.trials if isinstance(t.outcome, Failure)]
    assert failed and failed[0].outcome.cause is FailureCause.OUT_OF_MEMORY  # type: ignore[union-attr]
    assert _best(result) == _at(48, 1024)
    stored = [json.loads(line) for line in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert any(s["outcome"]["kind"] == "failed" and s["outcome"]["cause"] == "out_of_memory"
               for s in stored)  # fmt: skip


def test_default_out_of_memory_cuts_max_model_len_first() -> None:
    space = SearchSpace(
        axes=(
            Axis(Knob.MAX_NUM_SEQS, (16, 32, 64, 128), 2),
            Axis(Knob.MAX_MODEL_LEN, (1024, 2048, 4096, 8192)),
        ),
        default=TrialConfig.of({Knob.MAX_NUM_SEQS: 128, Knob.MAX_MODEL_LEN: 8192}),
        check=lambda c: None,
    )
    failed = Trial(1, space.default, Failure(FailureCause.OUT_OF_MEMORY, "oom"), 1.0, "default")
    decision = decide(space, [failed], Goal(SLA, 10))
    assert isinstance(decision, Proposal)
    assert decision.config.get(Knob.MAX_MODEL_LEN) == 1024
    assert decision.config.get(Knob.MAX_NUM_SEQS) == 128
    assert "max_model_len" in decision.reason


def test_every_trial_failing_stops_with_nothing_runs() -> None:
    space = two_knob_space()
    history: list[Trial] = []
    goal = Goal(SLA, 50)
    while isinstance(decision := decide(space, history, goal), Proposal):
        crash = Failure(FailureCause.CRASHED, "segfault")
        history.append(Trial(len(history) + 1, decision.config, crash, 1.0, decision.reason))
    assert isinstance(decision, Stop) and decision.reason is StopReason.NOTHING_RUNS


def test_planner_refusing_everything_stops_before_launching() -> None:
    space = SearchSpace(axes=(), default=_at(8, 8), check=lambda c: "needs 3 GB more per device")
    decision = decide(space, [], Goal(SLA, 10))
    assert isinstance(decision, Stop) and decision.reason is StopReason.NOTHING_FITS
    assert "3 GB" in decision.detail


def test_seqs_moves_the_sweep_shows_are_no_ops_are_not_run() -> None:
    space = two_knob_space()
    quiet = Measurement((run(4, 1.0),), capacity=128, preemptions=0, kv_capacity_tokens=None,
                        startup_s=0.0)  # fmt: skip
    history = [Trial(1, space.default, quiet, 1.0, "default")]
    decision = decide(space, history, Goal(SLA, 10))
    assert isinstance(decision, Proposal)
    assert decision.config.get(Knob.MAX_NUM_SEQS) == 128
    assert any("changes nothing" in why for _, why in decision.pruned)


def test_preemptions_put_memory_relief_first() -> None:
    space = SearchSpace(
        axes=(
            Axis(Knob.MAX_NUM_SEQS, (16, 32, 64, 128), 2),
            Axis(Knob.MAX_MODEL_LEN, (1024, 2048, 4096)),
        ),
        default=TrialConfig.of({Knob.MAX_NUM_SEQS: 64, Knob.MAX_MODEL_LEN: 4096}),
        check=lambda c: None,
    )
    full = Measurement((run(128, 1.0),), capacity=64, preemptions=37, kv_capacity_tokens=9000,
                       startup_s=0.0)  # fmt: skip
    decision = decide(space, [Trial(1, space.default, full, 1.0, "default")], Goal(SLA, 10))
    assert isinstance(decision, Proposal)
    # It started, so max_model_len reserved nothing: fewer sequences is the relief.
    assert decision.config.get(Knob.MAX_MODEL_LEN) == 4096
    assert decision.config.get(Knob.MAX_NUM_SEQS) == 16
    assert "KV cache full" in decision.reason and "lower max_num_seqs" in decision.reason


def test_impossible_sla_reports_best_effort_and_the_binding_slo(tmp_path: Path) -> None:
    def slow(config: TrialConfig) -> Outcome | None:
        seqs = int(config.get(Knob.MAX_NUM_SEQS))
        # TTFT is far past 1,000 ms everywhere, worst with big batches; TPOT is fine.
        runs = (run(2 * seqs, 0.0, ttft_ms=3000 + 10 * seqs, tpot_ms=20),)
        return Measurement(runs, capacity=seqs, preemptions=0, kv_capacity_tokens=None,
                           startup_s=0.0)  # fmt: skip

    result = _search(two_knob_space(), SurfaceRunner(fail=slow), tmp_path, budget=8)
    summary = summarize(result.trials, SLA, result.trials[0].config, result.stop)
    assert not summary.met and summary.best is None
    assert summary.best_effort is not None
    binding = summary.binding
    assert binding is not None and binding.key == "ttft_p99_ms"
    assert binding.observed_ms > binding.limit_ms
    # The search moves toward the SLA even when nothing meets it: smaller batches come closer.
    assert int(summary.best_effort.trial.config.get(Knob.MAX_NUM_SEQS)) < 128


def _stalled_at_two(itl_ms: float, ttft_ms: float) -> Measurement:
    """c=1 meets the SLA; c=2 misses it on inter-token latency or TTFT; 520-token prompts."""
    runs = (run(1, 1.0), run(2, 0.0, tpot_ms=itl_ms, ttft_ms=ttft_ms))
    runs = tuple(r.model_copy(update={"input_tokens_mean": 520.0}) for r in runs)
    return Measurement(runs, capacity=128, preemptions=0, kv_capacity_tokens=None, startup_s=0.0)


def test_a_binding_per_token_slo_chunks_prefills_to_one_prompt_per_step() -> None:
    space = two_knob_space()
    stalled = _stalled_at_two(itl_ms=400, ttft_ms=100)  # the SLA's tpot limit is 50 ms
    decision = decide(space, [Trial(1, space.default, stalled, 1.0, "default")], Goal(SLA, 10))
    assert isinstance(decision, Proposal)
    # 512 is the ladder's largest value within one 520-token prompt; 2048 let four in a step.
    assert decision.config == _at(128, 512)
    assert "per-token SLO binds" in decision.reason and "one prompt per step" in decision.reason


def test_a_binding_ttft_slo_does_not_chunk_prefills() -> None:
    space = two_knob_space()
    slow_first = _stalled_at_two(itl_ms=10, ttft_ms=5000)
    decision = decide(space, [Trial(1, space.default, slow_first, 1.0, "default")], Goal(SLA, 10))
    assert isinstance(decision, Proposal)
    assert "per-token" not in decision.reason
    assert decision.config != _at(128, 512)
