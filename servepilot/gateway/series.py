"""The series the gateway's hot path updates, and the metric families they become.

A prometheus_client labelled child takes a lock per update, which every proxied request would
pay for; these are plain dicts of ints and bucket counts instead, keyed by label values, and
are turned into metric families (all prefixed `servepilot_`) only when /metrics is scraped.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

# From a cached short answer (ms) to a long queued prefill (minutes).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Bucket counts and a sum: one bisect and two additions per observation."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class Counts(dict[tuple[str, ...], int]):
    """Counters by label values."""

    def add(self, key: tuple[str, ...], amount: int = 1) -> None:
        self[key] = self.get(key, 0) + amount


class Histograms(dict[tuple[str, ...], Histogram]):
    """Histograms by label values."""

    def observe(self, key: tuple[str, ...], value: float) -> None:
        self.series(key).observe(value)

    def series(self, key: tuple[str, ...]) -> Histogram:
        """The histogram of the label values `key` (a new series on first use)."""
        histogram = self.get(key)
        if histogram is None:
            histogram = self[key] = Histogram()
        return histogram


def counter(name: str, doc: str, labels: list[str], counts: Counts) -> CounterMetricFamily:
    family = CounterMetricFamily(f"servepilot_{name}", doc, labels=labels)
    for key, count in list(counts.items()):
        family.add_metric(list(key), count)
    return family


def histogram(
    name: str, doc: str, labels: list[str], histograms: Histograms
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(f"servepilot_{name}", doc, labels=labels)
    for key, series in list(histograms.items()):
        family.add_metric(list(key), series.buckets(), series.total)
    return family


def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"servepilot_{name}", doc, labels=list(labels))
