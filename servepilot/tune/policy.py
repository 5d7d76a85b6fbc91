"""The search policy: from the search space and the trials so far, the next trial or a stop.

A pure function (`decide`): no clock, no I/O, no randomness. Given the same history it makes
the same decision, which is what lets a re-run resume: the trials it asks for again are found
in trials.jsonl instead of being run.

The search is seed 004's tuning story, one knob at a time, as a pattern search:
1. Start from the planner's configuration (the default). While no trial has run, or after a
   failure, move the memory knobs first: cut max_model_len to what the traffic needs, lower
   max_num_seqs, give the KV cache more memory, quantize the KV cache, then the weights.
2. Around the best trial so far (the incumbent), read its metrics (`score.diagnose`): the
   engine preempted -> the memory moves; the batch was full with SLA slack -> raise
   max_num_seqs, then max_num_batched_tokens; P99 rose while throughput stayed flat -> back
   off (lower them); a per-token SLO (ITL, TPOT) binds -> chunk prefills smaller: first
   straight to one prompt per step (the smallest max_num_batched_tokens that holds the mean
   prompt), then a step lower. A move that improved the incumbent is tried again.
3. Then every knob that is not a memory knob (max_num_seqs, max_num_batched_tokens, TP size)
   in both directions, each with its own step: a doubling (two positions of
   the x1.5 ladders) at first, halved to one position once both neighbours at that step are
   tried and neither improved (a bisection between the best and its neighbours). A knob keeps
   its step when another knob moves the incumbent.
4. A trial replaces the incumbent only if it beats it by more than `min_gain` (2%). The search
   stops when every knob is at its finest step with no untried neighbour, or when the budget
   of trials is spent. The memory knobs (max_model_len, the KV cache's memory and dtype, weight
   quantization) only move as relief when memory is the limit: they buy room, not speed.
Never proposed: what the planner says will not fit, what was tried, and a max_num_seqs change
the incumbent's own sweep shows cannot change anything (`moves.no_op`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from servepilot.core.slo import Slo
from servepilot.tune.moves import MEMORY_KNOBS, Move, apply, between, memory_moves, no_op, verb
from servepilot.tune.score import Diagnosis, Failure, Measurement, Score, Trial, better, diagnose
from servepilot.tune.score import score as score_of
from servepilot.tune.space import Axis, Knob, SearchSpace, TrialConfig

MIN_GAIN = 0.02


@dataclass(frozen=True, slots=True)
class Goal:
    sla: Slo
    budget_trials: int
    min_gain: float = MIN_GAIN


class StopReason(enum.StrEnum):
    CONVERGED = "converged"
    BUDGET = "budget"
    NOTHING_FITS = "nothing_fits"
    NOTHING_RUNS = "nothing_runs"


Pruned = tuple[tuple[TrialConfig, str], ...]


@dataclass(frozen=True, slots=True)
class Proposal:
    config: TrialConfig
    reason: str
    pruned: Pruned = ()
    """Moves skipped on the way: the planner says they do not fit, or they change nothing."""


@dataclass(frozen=True, slots=True)
class Stop:
    reason: StopReason
    detail: str
    pruned: Pruned = ()


Decision = Proposal | Stop


@dataclass(frozen=True, slots=True)
class Incumbent:
    trial: Trial
    score: Score
    came_by: Move | None
    """The one-knob move from the previous incumbent that made this one, if it was one."""

    @property
    def measured(self) -> Measurement:
        assert isinstance(self.trial.outcome, Measurement)
        return self.trial.outcome


@dataclass(frozen=True, slots=True)
class State:
    incumbent: Incumbent | None
    steps: tuple[tuple[Knob, int], ...]
    """Each knob's current step, in ladder positions."""

    def step(self, knob: Knob) -> int:
        return dict(self.steps)[knob]


def decide(space: SearchSpace, history: Sequence[Trial], goal: Goal) -> Decision:
    """The next trial to run, or why to stop."""
    if len(history) >= goal.budget_trials:
        return Stop(StopReason.BUDGET, f"the budget of {goal.budget_trials} trials is spent")
    if not history:
        return _first(space)
    tried = {t.config.key for t in history}
    state = replay(space, history, goal)
    best = state.incumbent
    if best is None:
        last = history[-1]
        cause = last.outcome.cause.value if isinstance(last.outcome, Failure) else "failed"
        head = f"trial {last.index} failed ({cause})"
        found = _pick(space, last.config, memory_moves(space), tried, None, head)
        if isinstance(found, Stop):
            return Stop(StopReason.NOTHING_RUNS, "every configuration tried failed", found.pruned)
        return found
    signs = diagnose(best.measured, best.score, goal.sla)
    scores = {t.config.key: _score(t, goal) for t in history}
    moves = list(_moves(space, state, signs, scores))
    head = f"from trial {best.trial.index} ({signs.describe()})"
    found = _pick(space, best.trial.config, moves, tried, best.measured, head)
    if isinstance(found, Stop):
        detail = (
            f"no untried neighbour of trial {best.trial.index} is left: none improved it by "
            f"more than {goal.min_gain:.0%}"
        )
        return Stop(StopReason.CONVERGED, detail, found.pruned)
    return found


def replay(space: SearchSpace, history: Sequence[Trial], goal: Goal) -> State:
    """The incumbent and each knob's step after `history`, as the search saw them: the first
    good trial, replaced only by one that beats it by more than `min_gain`."""
    steps = {axis.knob: axis.coarse_step for axis in space.axes if axis.knob not in MEMORY_KNOBS}
    current: Incumbent | None = None
    tried: set[str] = set()
    for trial in history:
        tried.add(trial.config.key)
        if isinstance(trial.outcome, Measurement):
            result = score_of(trial.outcome, goal.sla)
            if current is None:
                current = Incumbent(trial, result, None)
            elif better(result, current.score, goal.min_gain):
                came_by = between(space, current.trial.config, trial.config)
                current = Incumbent(trial, result, came_by)
        if current is not None:
            _shrink(space, current, steps, tried)
    return State(current, tuple(steps.items()))


def incumbent(space: SearchSpace, history: Sequence[Trial], goal: Goal) -> Incumbent | None:
    return replay(space, history, goal).incumbent


def _shrink(space: SearchSpace, best: Incumbent, steps: dict[Knob, int], tried: set[str]) -> None:
    """Halve a knob's step while both its neighbours at that step are settled."""
    for axis in space.axes:
        while (
            axis.knob in steps
            and steps[axis.knob] > 1
            and all(
                _settled(space, best, tried, Move(axis.knob, d, steps[axis.knob], ""))
                for d in (+1, -1)
            )
        ):
            steps[axis.knob] = max(1, steps[axis.knob] // 2)


def _settled(space: SearchSpace, best: Incumbent, tried: set[str], move: Move) -> bool:
    config = apply(space, best.trial.config, move)
    if config is None or config.key in tried or space.check(config) is not None:
        return True
    return no_op(best.trial.config, best.measured, config) is not None


def _score(trial: Trial, goal: Goal) -> Score | None:
    if isinstance(trial.outcome, Measurement):
        return score_of(trial.outcome, goal.sla)
    return None


def _first(space: SearchSpace) -> Decision:
    why = space.check(space.default)
    if why is None:
        return Proposal(space.default, "the planner's configuration (the default)")
    head = "the planner's configuration does not fit"
    found = _pick(space, space.default, memory_moves(space), set(), None, head)
    if isinstance(found, Stop):
        return Stop(StopReason.NOTHING_FITS, f"the planner's configuration does not fit: {why}")
    return found


def _moves(
    space: SearchSpace, state: State, signs: Diagnosis, scores: dict[str, Score | None]
) -> Iterator[Move]:
    best = state.incumbent
    assert best is not None
    prior = best.came_by
    if prior is not None:
        yield Move(prior.knob, prior.direction, prior.steps, f"{prior.why} again (it helped)")
    if signs.memory:
        yield from memory_moves(space, started=True)
    if signs.batch_full:
        yield from _rule(space, state, +1, "the batch was full while the SLA had slack")
    if signs.decode_stalled:
        yield from _chunk_prefills(space, state, best.trial.config, signs.prompt_tokens)
    if signs.overloaded:
        yield from _rule(space, state, -1, "P99 rose while throughput stayed flat: back off")
    for axis in space.axes:
        if axis.knob not in MEMORY_KNOBS:
            yield from _explore(axis, state.step(axis.knob), best.trial.config, scores)


def _rule(space: SearchSpace, state: State, direction: int, why: str) -> Iterator[Move]:
    for knob in (Knob.MAX_NUM_SEQS, Knob.MAX_NUM_BATCHED_TOKENS):
        if space.axis(knob) is not None:
            yield Move(knob, direction, state.step(knob), f"{why}: {verb(knob, direction)}")


def _chunk_prefills(
    space: SearchSpace, state: State, at: TrialConfig, prompt_tokens: float | None
) -> Iterator[Move]:
    """Seed 004: when decode latency binds, prefills should stall fewer steps of the running
    requests. A budget above the prompt lets more than one prompt into a step: the first move
    goes to the ladder's largest value within one prompt, the next a step below that."""
    knob = Knob.MAX_NUM_BATCHED_TOKENS
    axis = space.axis(knob)
    if axis is None or not at.has(knob) or (now := axis.index(at.get(knob))) is None:
        return
    why = f"a per-token SLO binds: smaller prefill chunks: {verb(knob, -1)}"
    within = [i for i, v in enumerate(axis.values) if prompt_tokens and float(v) <= prompt_tokens]
    down = 0
    if within and within[-1] < now:
        down = now - within[-1]
        yield Move(knob, -1, down, f"{why} to one prompt per step")
    yield Move(knob, -1, down + state.step(knob), why)


def _explore(
    axis: Axis, step: int, at: TrialConfig, scores: dict[str, Score | None]
) -> Iterator[Move]:
    """Both directions at the knob's step; at the finest step, toward the better of the
    coarse neighbours first (the bisection's side)."""
    sides = []
    for direction in (+1, -1):
        rank = 0.0
        if step < axis.coarse_step:
            moved = axis.moved(at.get(axis.knob), direction * axis.coarse_step)
            found = scores.get(at.with_value(axis.knob, moved).key) if moved is not None else None
            rank = found.goodput_rps - found.closeness * 1e-9 if found is not None else -1.0
        sides.append((rank, direction))
    note = " (refine)" if step < axis.coarse_step else ""
    for _, direction in sorted(sides, key=lambda s: -s[0]):
        yield Move(axis.knob, direction, step, verb(axis.knob, direction) + note)


def _pick(
    space: SearchSpace,
    base: TrialConfig,
    moves: Sequence[Move],
    tried: set[str],
    measured: Measurement | None,
    head: str,
) -> Decision:
    pruned: list[tuple[TrialConfig, str]] = []
    seen = set(tried)
    for move in moves:
        config = apply(space, base, move)
        if config is None or config.key in seen:
            continue
        seen.add(config.key)
        why = space.check(config)
        if why is None and measured is not None:
            why = no_op(base, measured, config)
        if why is not None:
            pruned.append((config, why))
            continue
        return Proposal(config, f"{head}: {move.why}", tuple(pruned))
    return Stop(StopReason.CONVERGED, "no move left", tuple(pruned))
