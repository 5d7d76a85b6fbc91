"""How a step's tokens reach their clients: one request after another, not together.

vLLM's API server streams an engine step's tokens from one event loop, request by request, so
the tokens of one step arrive spread out; the spread per token is its time to stream one
(the fleet simulator's `output_us_per_token`). Read from the arrival times of the tokens of
requests decoding together (bench's `chunk_s`): `servepilot calibrate`'s waves, and the GPU
suite's calibration cases measured with `bench --token-times`.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Final

STEP_SHARE: Final = (0.7, 1.3)
"""A step counts when it carried this share of the tokens of the fullest steps (their 90th
percentile): not the ramps at the start and end, which stream fewer at once, nor two steps
whose tokens came out together (an eager launch holds the first back)."""


def step_spreads_s(streams: Sequence[Sequence[float]]) -> list[float]:
    """Per full step of requests decoding together (each stream: its tokens' arrival times):
    the time between its tokens' arrivals, (last - first) / (tokens - 1). A step's tokens are
    the arrivals closer together than a quarter of the median time between a request's
    tokens (about a step)."""
    gaps = [b - a for times in streams for a, b in itertools.pairwise(times)]
    if not gaps:
        return []
    apart = statistics.median(gaps) / 4
    arrivals = sorted(t for times in streams for t in times)
    steps: list[list[float]] = []
    step = [arrivals[0]]
    for t in arrivals[1:]:
        if t - step[-1] > apart:
            steps.append(step)
            step = []
        step.append(t)
    steps.append(step)
    sizes = sorted(len(s) for s in steps)
    fullest = sizes[int(0.9 * (len(sizes) - 1))]
    low, high = max(2.0, STEP_SHARE[0] * fullest), STEP_SHARE[1] * fullest
    return [(s[-1] - s[0]) / (len(s) - 1) for s in steps if low <= len(s) <= high]


def us_per_token(spreads_s: Sequence[float]) -> float | None:
    """The time to stream a token, in us to 0.1: the median of `step_spreads_s`' readings
    (None without one)."""
    return round(statistics.median(spreads_s) * 1e6, 1) if spreads_s else None
