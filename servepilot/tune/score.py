"""A finished trial: what it measured, its goodput at the SLA, and what its metrics say.

Goodput at the SLA is bench's goodput (requests per second that met every per-request SLO)
at the highest-goodput level of the trial's sweep where the whole SLA holds (`sla.meets`).
When no level meets it the goodput is 0 and `closeness` (the smallest, over levels, of the
worst observed/limit ratio) says how far the trial came; the SLO at that ratio binds.

The diagnosis reads seed 004's signals from the same numbers, so both engines give them:
- memory: the engine preempted requests (its KV cache ran full) or failed out of memory;
- batch full: at the best level every slot of the batch was taken (load >= budget) and the SLA
  still had slack: the device could take more, so the concurrency knobs can go up;
- overloaded: past the best level throughput stayed flat (< 5% more) while P99 rose: back off;
- decode stalled: a per-token SLO (ITL or TPOT) is the one that binds. A step that carries a
  prefill makes every running request wait for it, so long prompts admitted in big chunks
  show up as inter-token latency; smaller chunks (max_num_batched_tokens) trade TTFT for it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from servepilot.core.results import LoadMode, Run
from servepilot.core.slo import Slo
from servepilot.tune.sla import Violation, meets, worst
from servepilot.tune.space import TrialConfig

SLACK_RATIO = 0.8
"""The SLA has slack at a level whose worst observed/limit ratio is below this."""
FLAT_GAIN = 0.05
"""A level that adds less throughput than this share is flat (bench's plateau rule)."""
PER_TOKEN_KEYS = ("itl_", "tpot_")


class FailureCause(enum.StrEnum):
    OUT_OF_MEMORY = "out_of_memory"
    """The engine refused the configuration or died for lack of memory (KV or weights)."""
    DID_NOT_START = "did_not_start"
    """The replica exited or timed out before it served, for another reason."""
    CRASHED = "crashed"
    """The replica died while the load ran."""
    BENCH_FAILED = "bench_failed"
    """The sweep could not run (every request failed, or the client failed)."""


@dataclass(frozen=True, slots=True)
class Failure:
    cause: FailureCause
    detail: str


@dataclass(frozen=True, slots=True)
class Measurement:
    runs: tuple[Run, ...]
    """The trial's sweep, one bench run per load level, in the order they ran."""
    capacity: int
    """Requests the fleet holds in its batches at once: replicas x each one's budget."""
    preemptions: int
    kv_capacity_tokens: int | None
    startup_s: float


Outcome = Measurement | Failure


@dataclass(frozen=True, slots=True)
class Trial:
    index: int
    config: TrialConfig
    outcome: Outcome
    wall_s: float
    reason: str
    """Why the search ran it (the policy's reason)."""

    @property
    def ok(self) -> bool:
        return isinstance(self.outcome, Measurement)


@dataclass(frozen=True, slots=True)
class Score:
    goodput_rps: float
    best: Run | None
    """The level that scored (None when no level meets the SLA)."""
    closeness: float
    """min over levels of the worst observed/limit ratio: <= 1 when a level meets the SLA."""
    binding: Violation | None
    """The SLO that stopped the trial going higher (or kept it from meeting the SLA)."""

    @property
    def met(self) -> bool:
        return self.best is not None


def score(measurement: Measurement, sla: Slo) -> Score:
    runs = sorted(measurement.runs, key=lambda r: r.load.value)
    passing = [r for r in runs if meets(r, sla)]
    ratios = [(w.ratio, r) for r in runs if (w := worst(r, sla)) is not None]
    closeness = min((ratio for ratio, _ in ratios), default=float("inf"))
    if not passing:
        nearest = min(ratios, key=lambda pair: pair[0])[1] if ratios else None
        binding = worst(nearest, sla) if nearest is not None else None
        return Score(0.0, None, closeness, binding)
    best = max(passing, key=lambda r: (r.goodput_rps, -r.load.value))
    beyond = [r for r in runs if r.load.value > best.load.value and not meets(r, sla)]
    binding = worst(beyond[0], sla) if beyond else worst(best, sla)
    return Score(best.goodput_rps, best, closeness, binding)


def better(a: Score, b: Score, threshold: float) -> bool:
    """`a` beats `b` by more than `threshold` (a share): on goodput when either meets the
    SLA, else on closeness (a smaller worst ratio)."""
    if a.met or b.met:
        return a.goodput_rps > b.goodput_rps * (1.0 + threshold)
    return a.closeness < b.closeness * (1.0 - threshold)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    memory: bool
    batch_full: bool
    overloaded: bool
    slack: bool
    decode_stalled: bool = False
    prompt_tokens: float | None = None
    """Mean prompt length of the level the binding SLO was read at (None if unmeasured)."""

    def describe(self) -> str:
        signs = [
            ("KV cache full (preemptions)", self.memory),
            ("batch full with SLA slack", self.batch_full),
            ("P99 rising with flat throughput", self.overloaded),
            ("a per-token SLO binds", self.decode_stalled),
        ]
        named = [name for name, on in signs if on]
        return ", ".join(named) or "no strong signal"


def diagnose(measurement: Measurement, result: Score, sla: Slo) -> Diagnosis:
    memory = measurement.preemptions > 0
    best = result.best
    binding = result.binding
    # It binds when it stopped the sweep: a level past the best missed it (or none met).
    stopped = best is None or any(r.load.value > best.load.value for r in measurement.runs)
    stalled = stopped and binding is not None and binding.key.startswith(PER_TOKEN_KEYS)
    prompts = [r.input_tokens_mean for r in measurement.runs if r.input_tokens_mean]
    prompt_tokens = sum(prompts) / len(prompts) if prompts else None
    if best is None:
        return Diagnosis(memory, False, False, False, stalled, prompt_tokens)
    at_best = worst(best, sla)
    slack = at_best is not None and at_best.ratio < SLACK_RATIO
    closed = best.load.mode is LoadMode.CONCURRENCY
    batch_full = closed and slack and best.load.value >= measurement.capacity
    beyond = sorted(
        (r for r in measurement.runs if r.load.value > best.load.value),
        key=lambda r: r.load.value,
    )
    overloaded = bool(beyond) and _flat_and_rising(best, beyond[0])
    return Diagnosis(memory, batch_full, overloaded, slack, stalled, prompt_tokens)


def _flat_and_rising(best: Run, nxt: Run) -> bool:
    gain = _throughput(nxt) / _throughput(best) - 1.0 if _throughput(best) > 0 else 0.0
    p99_a, p99_b = best.e2e_ms.p99, nxt.e2e_ms.p99
    return gain < FLAT_GAIN and p99_a is not None and p99_b is not None and p99_b > p99_a


def _throughput(run: Run) -> float:
    return run.output_throughput or run.request_throughput
