"""What load to generate, and for how long: the input of `run_load`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.load.arrivals import Arrival


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """One load level.

    Warm-up requests come first and on top of the measured ones: `max_requests` and
    `duration_s` count only what is measured. A run stops at whichever of `max_requests` and
    `duration_s` comes first; at least one must be set.
    """

    load: Load
    """Closed loop (`concurrency`: that many requests in flight) or open loop (`rate`/s)."""
    max_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    warmup_s: float = 0.0
    """Alternatively (or as well), every request sent in the first `warmup_s` is warm-up."""
    arrival: Arrival = Arrival.POISSON
    """Open loop: how send times are spread (requests with `at_s` replay those instead)."""
    burstiness: float = 1.0
    seed: int = 0
    processes: int | None = None
    """Client processes; None chooses (see `runner.choose_processes`)."""
    grace_s: float = 30.0
    """Duration-bound runs: how long requests in flight at the stop may still finish."""

    def __post_init__(self) -> None:
        if self.max_requests is None and self.duration_s is None:
            raise ConfigError("a load needs a number of requests or a duration")
        if self.max_requests is not None and self.max_requests < 0:
            raise ConfigError(f"--requests must be at least 0, got {self.max_requests}")
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise ConfigError(f"--duration must be above 0 s, got {self.duration_s}")
        if self.warmup_requests < 0 or self.warmup_s < 0 or self.grace_s < 0:
            raise ConfigError("warm-up and grace must not be negative")
        if self.processes is not None and self.processes < 1:
            raise ConfigError(f"--processes must be at least 1, got {self.processes}")
        value = self.load.value
        if self.load.mode is LoadMode.CONCURRENCY and not (value >= 1 and value == int(value)):
            raise ConfigError(f"--concurrency must be a whole number >= 1, got {value}")
        if self.load.mode is LoadMode.RATE and not (math.isfinite(value) and value > 0):
            raise ConfigError(
                f"--rate must be a finite number of requests per second above 0, got {value}",
                hint="for as-fast-as-possible load use --concurrency instead",
            )

    @property
    def closed(self) -> bool:
        """Closed loop (`concurrency` requests in flight), else open loop (`rate`/s)."""
        return self.load.mode is LoadMode.CONCURRENCY
