"""The search loop: ask the policy, run (or find) the trial, record it, repeat.

I/O stays behind two small interfaces: a `TrialRunner` runs one configuration and returns
what happened (the sim runner in-process, the vLLM runner on real replicas), and the
`TrialStore` keeps every finished trial in trials.jsonl. A trial the store already holds is
not run again: a re-run with the same --out resumes where the last one stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from servepilot.tune.policy import Goal, Proposal, Stop, decide
from servepilot.tune.score import Outcome, Trial
from servepilot.tune.space import SearchSpace, TrialConfig
from servepilot.tune.store import TrialStore


class TrialRunner(Protocol):
    def run(self, config: TrialConfig) -> Outcome:
        """Launch `config`, measure it, stop it (always, whatever happens); a trial that
        fails (crash, out of memory) is a `Failure` outcome, not an exception."""
        ...


@dataclass(frozen=True, slots=True)
class SearchEvents:
    """Callbacks the CLI turns into progress lines."""

    started: Callable[[int, Proposal], None]
    finished: Callable[[Trial, bool], None]
    """(trial, resumed): resumed trials were read from trials.jsonl, not run."""
    pruned: Callable[[TrialConfig, str], None]


@dataclass(frozen=True, slots=True)
class SearchResult:
    trials: tuple[Trial, ...]
    stop: Stop
    resumed: int
    pruned: tuple[tuple[TrialConfig, str], ...]


def run_search(
    space: SearchSpace,
    goal: Goal,
    runner: TrialRunner,
    store: TrialStore,
    events: SearchEvents,
) -> SearchResult:
    finished = store.load().trials
    history: list[Trial] = []
    pruned: list[tuple[TrialConfig, str]] = []
    resumed = 0
    while True:
        decision = decide(space, history, goal)
        for config, why in decision.pruned:
            if all(config != seen for seen, _ in pruned):
                pruned.append((config, why))
                events.pruned(config, why)
        if isinstance(decision, Stop):
            return SearchResult(tuple(history), decision, resumed, tuple(pruned))
        index = len(history) + 1
        known = finished.get(decision.config.key)
        if known is not None:
            trial = replace(known, index=index, reason=decision.reason)
            resumed += 1
            events.finished(trial, True)
        else:
            events.started(index, decision)
            t0 = time.monotonic()
            outcome = runner.run(decision.config)
            trial = Trial(index, decision.config, outcome, time.monotonic() - t0, decision.reason)
            store.append(trial)
            events.finished(trial, False)
        history.append(trial)
