"""Latency percentiles over the last minute, from cumulative histograms scraped now and then.

A histogram on a /metrics page counts every observation since the process started. What
happened in the last minute is the difference between the newest scrape and one taken a
minute before it; its percentiles are read the way Prometheus' `histogram_quantile` reads
them: the bucket the rank falls into, interpolated linearly inside it. Pure: the caller
passes the scrape times, so tests give them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from servepilot.engine.metrics import Histogram

T = TypeVar("T")

EMPTY = Histogram(buckets=(), count=0.0, sum=0.0)


def delta(newer: Histogram, older: Histogram) -> Histogram:
    """The observations `newer` holds that `older` did not. A count that went down means the
    process restarted (its counters began again at zero): then all of `newer` is new."""
    if newer.count < older.count:
        return newer
    before = dict(older.buckets)
    buckets = tuple((bound, count - before.get(bound, 0.0)) for bound, count in newer.buckets)
    return Histogram(buckets=buckets, count=newer.count - older.count, sum=newer.sum - older.sum)


def quantile(q: float, histogram: Histogram) -> float | None:
    """The `q` quantile (0..1) of a cumulative histogram, as Prometheus' histogram_quantile
    computes it; None when it holds no observation. A rank in the +Inf bucket reads as the
    largest finite bound (nothing is known above it)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not within 0..1")
    finite = [(bound, count) for bound, count in histogram.buckets if bound != float("inf")]
    total = histogram.buckets[-1][1] if histogram.buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in finite:
        if count >= rank:
            if count == lower_count:
                return bound
            share = (rank - lower_count) / (count - lower_count)
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return finite[-1][0] if finite else None


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50 and p99 in milliseconds over a window, and how many observations it held."""

    p50_ms: float | None
    p99_ms: float | None
    count: int


def percentiles_ms(histogram: Histogram) -> Percentiles:
    def ms(q: float) -> float | None:
        value = quantile(q, histogram)
        return None if value is None else value * 1000.0

    return Percentiles(p50_ms=ms(0.50), p99_ms=ms(0.99), count=int(histogram.count))


class Window(Generic[T]):
    """Samples over the last `window_s` seconds, and one before them: the baseline that the
    window's differences are taken from."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, T]] = deque()

    def add(self, at_s: float, sample: T) -> None:
        self._samples.append((at_s, sample))
        # Keep the newest sample at or before the window's start: it is the baseline.
        start_s = at_s - self.window_s
        while len(self._samples) > 1 and self._samples[1][0] <= start_s:
            self._samples.popleft()

    def ends(self) -> tuple[T, T] | None:
        """(baseline, newest); None with fewer than two samples, since a lone cumulative
        sample says nothing about the last minute."""
        if len(self._samples) < 2:
            return None
        return self._samples[0][1], self._samples[-1][1]

    def span_s(self) -> float:
        """Seconds the window covers so far (it grows to `window_s` over the first minute)."""
        if len(self._samples) < 2:
            return 0.0
        return self._samples[-1][0] - self._samples[0][0]


def counter_delta(newer: float, older: float) -> float:
    """A counter's increase; one that went down restarted from zero."""
    return newer if newer < older else newer - older
