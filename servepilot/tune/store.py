"""trials.jsonl: every finished trial, one JSON line each, so a re-run resumes.

A line is appended with one write() on a file opened O_APPEND and then fsync'd, so a crash
leaves at most one torn last line, which reading skips. Lines carry the trial's config key
(`TrialConfig.key`) and the run's context key: a hash of everything else a trial's numbers
depend on (engine, model, hardware, workload, SLA, sweep). A re-run with the same --out
reuses the trials of the same context and leaves the others alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servepilot.core.errors import ConfigError
from servepilot.core.results import Run
from servepilot.tune.score import Failure, FailureCause, Measurement, Outcome, Trial
from servepilot.tune.space import config_from_dict

SCHEMA = "servepilot.tune/v1"


@dataclass(frozen=True, slots=True)
class Loaded:
    trials: dict[str, Trial]
    """Finished trials of this context, by config key (the latest line wins)."""
    other_contexts: int
    """Lines of other contexts (another SLA, workload or engine), left alone."""
    torn_lines: int
    """Lines that could not be read (a crash mid-write), skipped."""


class TrialStore:
    def __init__(self, path: Path, context: str) -> None:
        self.path = path
        self.context = context

    def load(self) -> Loaded:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Loaded({}, 0, 0)
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read it ({exc.strerror})") from None
        trials: dict[str, Trial] = {}
        other = torn = 0
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if data.get("context") != self.context:
                    other += 1
                    continue
                trial = trial_from_json(data)
            except (ValueError, KeyError, TypeError, ValidationError):
                torn += 1
                continue
            trials[trial.config.key] = trial
        return Loaded(trials, other, torn)

    def append(self, trial: Trial) -> None:
        line = json.dumps(trial_to_json(trial, self.context), separators=(",", ":")) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)


def trial_to_json(trial: Trial, context: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "context": context,
        "key": trial.config.key,
        "index": trial.index,
        "config": trial.config.as_dict(),
        "reason": trial.reason,
        "wall_s": round(trial.wall_s, 3),
        "outcome": _outcome_json(trial.outcome),
    }


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, Failure):
        return {"kind": "failed", "cause": outcome.cause.value, "detail": outcome.detail}
    return {
        "kind": "measured",
        "capacity": outcome.capacity,
        "preemptions": outcome.preemptions,
        "kv_capacity_tokens": outcome.kv_capacity_tokens,
        "startup_s": round(outcome.startup_s, 3),
        "runs": [run.model_dump(mode="json") for run in outcome.runs],
    }


def trial_from_json(data: dict[str, Any]) -> Trial:
    if data.get("schema") != SCHEMA:
        raise ValueError("not a tune trial")
    config = config_from_dict(data["config"])
    if config.key != data["key"]:
        raise ValueError("the config does not match its key")
    raw = data["outcome"]
    outcome: Outcome
    if raw["kind"] == "failed":
        outcome = Failure(FailureCause(raw["cause"]), str(raw["detail"]))
    else:
        kv = raw["kv_capacity_tokens"]
        outcome = Measurement(
            runs=tuple(Run.model_validate(r) for r in raw["runs"]),
            capacity=int(raw["capacity"]),
            preemptions=int(raw["preemptions"]),
            kv_capacity_tokens=None if kv is None else int(kv),
            startup_s=float(raw["startup_s"]),
        )
    return Trial(
        index=int(data["index"]),
        config=config,
        outcome=outcome,
        wall_s=float(data["wall_s"]),
        reason=str(data["reason"]),
    )
