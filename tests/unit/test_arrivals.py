"""Arrival schedules: checked against the statistics each process must have.

Every schedule is seeded, so each check runs on the same numbers every time and cannot flake;
the tolerances are still several standard errors wide, so they hold for any seed.
"""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from servepilot.core.errors import ConfigError
from servepilot.load.arrivals import Arrival, arrival_offsets_s, iter_arrival_offsets_s


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(offsets)]


def _cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


@pytest.mark.parametrize("arrival", [Arrival.POISSON, Arrival.CONSTANT, Arrival.GAMMA])
def test_schedule_starts_at_zero_and_never_goes_back(arrival: Arrival) -> None:
    offsets = arrival_offsets_s(5.0, 1000, arrival, seed=3)
    assert len(offsets) == 1000
    assert offsets[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(offsets))


def test_poisson_mean_gap_and_cv() -> None:
    # 20k exponential gaps: the mean's standard error is 0.7%, the CV's about 1%.
    gaps = _gaps(arrival_offsets_s(8.0, 20_001, Arrival.POISSON, seed=11))
    assert statistics.fmean(gaps) == pytest.approx(1 / 8.0, rel=0.02)
    assert _cv(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_mean_gap_and_cv(burstiness: float) -> None:
    # Shape 0.25 has CV 2, so its mean needs more samples for the same 2% (SE 0.45% here).
    gaps = _gaps(arrival_offsets_s(20.0, 200_001, Arrival.GAMMA, burstiness=burstiness, seed=5))
    assert statistics.fmean(gaps) == pytest.approx(1 / 20.0, rel=0.02)
    assert _cv(gaps) == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_lower_burstiness_is_burstier() -> None:
    cvs = [
        _cv(_gaps(arrival_offsets_s(10.0, 20_001, Arrival.GAMMA, burstiness=b, seed=1)))
        for b in (0.25, 1.0, 4.0)
    ]
    assert cvs[0] > cvs[1] > cvs[2]


def test_constant_is_exactly_one_over_rate_apart() -> None:
    offsets = arrival_offsets_s(4.0, 10_000, Arrival.CONSTANT, seed=0)
    assert offsets == [i / 4.0 for i in range(10_000)]
    assert offsets[-1] == 9999 * 0.25


def test_constant_ignores_the_seed() -> None:
    assert arrival_offsets_s(3.0, 50, Arrival.CONSTANT, seed=1) == arrival_offsets_s(
        3.0, 50, Arrival.CONSTANT, seed=2
    )


@pytest.mark.parametrize("arrival", [Arrival.POISSON, Arrival.GAMMA])
def test_same_seed_same_schedule_other_seed_other(arrival: Arrival) -> None:
    burstiness = 0.5 if arrival is Arrival.GAMMA else 1.0
    first = arrival_offsets_s(10.0, 500, arrival, burstiness=burstiness, seed=42)
    assert first == arrival_offsets_s(10.0, 500, arrival, burstiness=burstiness, seed=42)
    other = arrival_offsets_s(10.0, 500, arrival, burstiness=burstiness, seed=43)
    assert first[1:] != other[1:]
    assert all(a != b for a, b in zip(first[1:], other[1:], strict=True))


@pytest.mark.parametrize("arrival", list(Arrival))
def test_endless_schedule_starts_with_the_counted_one(arrival: Arrival) -> None:
    burstiness = 2.0 if arrival is Arrival.GAMMA else 1.0
    counted = arrival_offsets_s(7.0, 300, arrival, burstiness=burstiness, seed=9)
    endless = iter_arrival_offsets_s(7.0, arrival, burstiness=burstiness, seed=9)
    assert list(itertools.islice(endless, 300)) == counted
    # It keeps going: a duration-bounded run takes offsets until one passes its end.
    assert next(endless) > counted[-1]


def test_endless_schedule_reaches_a_duration() -> None:
    endless = iter_arrival_offsets_s(50.0, Arrival.POISSON, seed=2)
    within = list(itertools.takewhile(lambda t: t < 600.0, endless))
    # 600 s at 50/s: about 30,000 arrivals (Poisson SD ~173).
    assert len(within) == pytest.approx(30_000, rel=0.03)


def test_zero_requests_is_an_empty_schedule() -> None:
    assert arrival_offsets_s(1.0, 0, Arrival.POISSON, seed=0) == []


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan])
def test_bad_rate_names_the_flag(rate: float) -> None:
    with pytest.raises(ConfigError, match="--rate"):
        arrival_offsets_s(rate, 10, Arrival.POISSON, seed=0)
    with pytest.raises(ConfigError, match="--rate"):
        iter_arrival_offsets_s(rate, Arrival.CONSTANT, seed=0)


@pytest.mark.parametrize("burstiness", [0.0, -0.5, math.inf, math.nan])
def test_bad_burstiness_names_the_flag(burstiness: float) -> None:
    with pytest.raises(ConfigError, match="--burstiness"):
        arrival_offsets_s(1.0, 10, Arrival.GAMMA, burstiness=burstiness, seed=0)


def test_burstiness_with_a_non_gamma_arrival_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--burstiness 0\.5 only applies to --arrival gamma"):
        arrival_offsets_s(1.0, 10, Arrival.POISSON, burstiness=0.5, seed=0)


def test_negative_count_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--requests"):
        arrival_offsets_s(1.0, -1, Arrival.POISSON, seed=0)
