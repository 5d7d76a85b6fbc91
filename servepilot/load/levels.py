"""A run's load levels: which loads, how many requests each, from which workload.

`LevelOptions` holds what `servepilot bench` and `servepilot sim` share of their load and
workload flags; both options records carry one. From it follow, the same for both, each
level's `LoadPlan`, how many distinct requests its workload holds, and the next level (the
given loads in order, or the sweep's next step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode, Run
from servepilot.load.arrivals import Arrival
from servepilot.load.loadplan import LoadPlan
from servepilot.load.sweep import SweepConfig, SweepStep, next_step
from servepilot.load.workload import WorkloadSpec

DURATION_POOL_MAX = 20_000
"""A duration-bound level cycles a pool of at most this many distinct requests."""


@dataclass(frozen=True, slots=True)
class LevelOptions:
    workload: WorkloadSpec
    loads: tuple[Load, ...]
    """Explicit load levels; empty when sweeping."""
    sweep: SweepConfig | None
    requests: int | None
    """Requests per level; None with a duration, or for the default."""
    duration_s: float | None
    warmup_requests: int
    arrival: Arrival
    burstiness: float

    def plan(
        self,
        load: Load,
        *,
        seed: int,
        soak_s: float | None = None,
        processes: int | None = None,
    ) -> LoadPlan:
        """The level at `load`; a soak is one level of `soak_s`."""
        duration = soak_s if soak_s is not None else self.duration_s
        requests = None if duration is not None else (self.requests or default_requests(load))
        return LoadPlan(
            load=load,
            max_requests=requests,
            duration_s=duration,
            warmup_requests=self.warmup_requests,
            arrival=self.arrival,
            burstiness=self.burstiness,
            seed=seed,
            processes=processes,
        )

    def level_workload(self, index: int) -> WorkloadSpec:
        """The workload of the level at `index`: its own seed, so levels do not repeat prompts."""
        return dataclasses.replace(self.workload, seed=self.workload.seed + index)

    def next_level(self, runs: Sequence[Run]) -> SweepStep:
        """The load after `runs` (the levels run so far, in order): the next given one, or the
        sweep's next step."""
        if self.sweep is not None:
            return next_step(self.sweep, runs)
        if len(runs) < len(self.loads):
            return SweepStep(self.loads[len(runs)], "given")
        return SweepStep(None, "every given level ran")


def default_requests(load: Load) -> int:
    """Enough requests for a P99 to mean something, and for every worker to cycle a few times."""
    if load.mode is LoadMode.CONCURRENCY:
        return max(100, int(5 * load.value))
    return max(100, int(30 * load.value))


def pool_size(plan: LoadPlan) -> int:
    """How many distinct requests the level's workload holds (slots cycle through them)."""
    if plan.max_requests is not None:
        return plan.max_requests + plan.warmup_requests
    # Duration-bound: enough distinct prompts that repeats (and so prefix-cache hits that a
    # real workload would not get) are rare.
    per_s = plan.load.value if plan.load.mode is LoadMode.RATE else 4 * plan.load.value
    wanted = int(per_s * (plan.duration_s or 0) * 1.2) + plan.warmup_requests + 100
    return min(DURATION_POOL_MAX, wanted)


def parse_levels(text: str, flag: str) -> tuple[float, ...]:
    """`1,4,16` (the --concurrency and --rate flags) -> (1.0, 4.0, 16.0); every value positive."""
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: {part!r} is not a number") from None
        if value <= 0:
            raise ConfigError(f"{flag} {text!r}: levels must be positive")
        values.append(value)
    return tuple(values)
