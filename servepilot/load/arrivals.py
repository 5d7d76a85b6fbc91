"""Open-loop arrival schedules: when each request is due, as offsets from the start of a run.

The schedule is absolute (offsets from one start time, not gaps slept one after another), so a
sender that falls behind catches up against the schedule instead of drifting, and latency can be
measured from the intended send time.

The first request is due at 0.0 and the i-th at the sum of the first i gaps: a run never
begins with an idle gap (at 0.1 requests/s that would be ten seconds of nothing), and N
requests at rate r span about (N - 1) / r seconds.

Pure and seeded: no clock, no I/O; one seed always gives the same schedule.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
from collections.abc import Iterator

from servepilot.core.errors import ConfigError


class Arrival(enum.StrEnum):
    POISSON = "poisson"
    """Exponential gaps: independent arrivals, coefficient of variation 1."""
    CONSTANT = "constant"
    """Exactly 1/rate apart."""
    GAMMA = "gamma"
    """Gamma gaps with shape = burstiness: below 1 burstier than Poisson, above 1 smoother."""


def iter_arrival_offsets_s(
    rate_per_s: float, arrival: Arrival, *, burstiness: float = 1.0, seed: int
) -> Iterator[float]:
    """The endless schedule, for runs bounded by duration rather than by count.

    Its first N values are exactly `arrival_offsets_s(rate_per_s, N, ...)`.
    """
    _check(rate_per_s, arrival, burstiness)
    if arrival is Arrival.CONSTANT:
        # i / rate rather than a running sum, so offsets do not accumulate rounding error.
        return (i / rate_per_s for i in itertools.count())
    return _random_offsets_s(rate_per_s, arrival, burstiness, random.Random(seed))


def arrival_offsets_s(
    rate_per_s: float, count: int, arrival: Arrival, *, burstiness: float = 1.0, seed: int
) -> list[float]:
    """The first `count` offsets (seconds from the start) of the schedule."""
    if count < 0:
        raise ConfigError(f"--requests must be at least 0, got {count}")
    offsets = iter_arrival_offsets_s(rate_per_s, arrival, burstiness=burstiness, seed=seed)
    return list(itertools.islice(offsets, count))


def _random_offsets_s(
    rate_per_s: float, arrival: Arrival, burstiness: float, rng: random.Random
) -> Iterator[float]:
    offset_s = 0.0
    while True:
        yield offset_s
        if arrival is Arrival.POISSON:
            offset_s += rng.expovariate(rate_per_s)
        else:
            # Scale 1/(rate*shape) keeps the mean gap at 1/rate for every shape; the
            # coefficient of variation is 1/sqrt(shape) (vllm bench serve uses the same).
            offset_s += rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness))


def _check(rate_per_s: float, arrival: Arrival, burstiness: float) -> None:
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ConfigError(
            f"--rate must be a finite number of requests per second above 0, got {rate_per_s}",
            hint="for as-fast-as-possible load use --concurrency instead",
        )
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise ConfigError(f"--burstiness must be a finite number above 0, got {burstiness}")
    if arrival is not Arrival.GAMMA and burstiness != 1.0:
        raise ConfigError(
            f"--burstiness {burstiness} only applies to --arrival gamma, not {arrival}",
            hint="burstiness 1 is Poisson; below 1 is burstier, above 1 smoother",
        )
