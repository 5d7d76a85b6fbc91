"""The fleet simulator's latency histogram (servepilot/sim/fleet/collect.py): its percentiles
against numpy's on the expanded sample, and its bins once there are too many values to keep."""

from __future__ import annotations

import math
import random

import pytest

from servepilot.sim.fleet.collect import WeightedHistogram


def test_weighted_histogram_percentiles_match_numpy_on_the_expanded_sample() -> None:
    import numpy as np

    rng = random.Random(3)
    hist = WeightedHistogram()
    expanded: list[float] = []
    for _ in range(500):
        value, weight = rng.uniform(0.001, 0.2), rng.randint(1, 30)
        hist.add(value, weight)
        expanded += [value] * weight
    stats = hist.stats_ms()
    p50, p90, p99 = np.percentile(np.array(expanded) * 1000, [50, 90, 99])
    assert stats.p50 == pytest.approx(p50) and stats.p90 == pytest.approx(p90)
    assert stats.p99 == pytest.approx(p99)
    assert stats.mean == pytest.approx(float(np.mean(expanded)) * 1000)


def test_weighted_histogram_bins_many_distinct_values_within_their_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import servepilot.sim.fleet.collect as collect

    monkeypatch.setattr(collect, "EXACT_VALUES", 100)
    hist = WeightedHistogram()
    values = [0.01 + i * 1e-5 for i in range(5000)]
    for v in values:
        hist.add(v, 1)
    stats = hist.stats_ms()
    assert stats.p50 == pytest.approx(float(sorted(values)[2499] * 1000), rel=2e-4)
    assert stats.count == 5000
    assert not math.isnan(stats.p99 or math.nan)
