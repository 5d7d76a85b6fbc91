"""Headroom from the forecast's own errors, with known answers: a forecast that is always
right earns none, a square wave of bursts that a forecast one horizon old misses earns the
burst's height at a quantile above the share of seconds it misses, and none below it."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from servepilot.core.errors import ConfigError
from servepilot.scaling.headroom import ForecastErrors


def _naive(errors: ForecastErrors, series: list[float]) -> None:
    """Feed `series` with the naive forecast (the next seconds look like this one)."""
    for value in series:
        errors.record(value, value)


def test_a_forecast_that_is_always_right_earns_no_headroom() -> None:
    errors = ForecastErrors(horizon_s=10, window_s=600)
    _naive(errors, [40.0] * 700)
    assert (errors.errors, errors.headroom()) == (600, 0.0)


def test_nothing_before_a_first_horizon_has_passed() -> None:
    errors = ForecastErrors(horizon_s=10, window_s=600, smooth_s=1)
    _naive(errors, [5.0] * 9 + [500.0])
    assert (errors.errors, errors.headroom()) == (0, 0.0)
    errors.record(900.0, 900.0)  # the 11th second: 900 against the forecast of second 1 (5)
    assert (errors.errors, errors.headroom()) == (1, 895.0)


@pytest.mark.parametrize(("quantile", "headroom"), [(0.95, 70.0), (0.91, 70.0), (0.90, 0.0)])
def test_bursts_a_forecast_misses_earn_their_height(quantile: float, headroom: float) -> None:
    # 40 req/s with a burst to 110 for 30 s every 100 s; the naive forecast made 10 s
    # earlier misses each rise by 70 for 10 s (10% of the seconds), overshoots each fall by
    # 70 for 10 s, and is right the rest. Over the 600 s window: 60 errors of +70, 60 of
    # -70, 480 of 0: ranked, the +70s are the 541st to the 600th. Nearest rank: 0.95 -> the
    # 570th, 0.91 -> the 546th (both 70); 0.90 -> the 540th, the last 0: bursts in 10% of
    # the seconds are a risk the 90% quantile takes.
    period = [40.0] * 70 + [110.0] * 30
    errors = ForecastErrors(horizon_s=10, window_s=600, quantile=quantile, smooth_s=1)
    _naive(errors, period * 8)
    assert errors.errors == 600
    assert errors.headroom() == headroom


def test_a_forecast_too_high_earns_nothing_back() -> None:
    errors = ForecastErrors(horizon_s=5, window_s=100, smooth_s=1)
    for _ in range(200):
        errors.record(10.0, 50.0)
    assert errors.headroom() == 0.0


def test_smoothing_keeps_a_single_noisy_second_out() -> None:
    # One second of 160 among 40s: over a 15 s mean it is +8 req/s, not +120.
    errors = ForecastErrors(horizon_s=1, window_s=20, quantile=1.0, smooth_s=15)
    for value in [40.0] * 30 + [160.0]:
        errors.record(value, 40.0)
    assert errors.headroom() == pytest.approx(8.0)


def test_refuses_nonsense() -> None:
    with pytest.raises(ConfigError):
        ForecastErrors(horizon_s=0.0)
    with pytest.raises(ConfigError):
        ForecastErrors(horizon_s=10.0, quantile=0.0)
    with pytest.raises(ConfigError):
        ForecastErrors(horizon_s=10.0, window_s=0)
    with pytest.raises(ConfigError):
        ForecastErrors(horizon_s=10.0, smooth_s=0)


def test_poisson_noise_is_taken_off_the_headroom() -> None:
    # 60 req/s against a forecast of 40: every error is +20. A 15 s mean of Poisson
    # arrivals at 60 req/s has a standard deviation of sqrt(60 / 15) = 2, so the noise alone
    # puts 1.645 x 2 = 3.29 at the 95th percentile: the headroom is 20 - 3.29 = 16.71.
    errors = ForecastErrors(horizon_s=10, window_s=600, less_poisson_noise=True)
    for _ in range(700):
        errors.record(60.0, 40.0)
    z95 = NormalDist().inv_cdf(0.95)
    assert errors.noise() == pytest.approx(z95 * 2.0)
    assert errors.headroom() == pytest.approx(20.0 - 3.2897, abs=1e-4)
    # Without the flag the raw quantile (the counts need not be arrivals).
    raw = ForecastErrors(horizon_s=10, window_s=600)
    for _ in range(700):
        raw.record(60.0, 40.0)
    assert (raw.noise(), raw.headroom()) == (0.0, 20.0)


def test_a_perfect_forecast_of_poisson_arrivals_earns_next_to_nothing() -> None:
    # Seeded Poisson arrivals at 60 req/s, forecast exactly at 60: the raw 95th percentile
    # of the 15 s means' errors is the noise's own (about 3.3 req/s); less it, next to none.
    rng = np.random.default_rng(0)
    counts = [float(c) for c in rng.poisson(60.0, size=1200)]
    raw = ForecastErrors(horizon_s=90, window_s=600)
    less = ForecastErrors(horizon_s=90, window_s=600, less_poisson_noise=True)
    for value in counts:
        raw.record(value, 60.0)
        less.record(value, 60.0)
    assert 2.5 < raw.headroom() < 4.5
    assert less.headroom() < 1.0
    assert less.noise() == pytest.approx(3.29, abs=0.1)


def test_at_quantile_one_the_noise_is_that_of_the_highest_of_the_window() -> None:
    # Nearest rank at quantile 1 is the highest of n errors: about the 1 - 1/(n + 1)
    # quantile of the noise; n = 99 -> z(0.99) = 2.326, x sqrt(15 / 15) at 15 req/s.
    errors = ForecastErrors(horizon_s=5, window_s=99, quantile=1.0, less_poisson_noise=True)
    for _ in range(200):
        errors.record(15.0, 10.0)
    assert errors.noise() == pytest.approx(NormalDist().inv_cdf(0.99))
    assert errors.headroom() == pytest.approx(5.0 - 2.3263, abs=1e-4)


def test_with_fade_a_one_off_miss_counts_less_with_its_age() -> None:
    # One second misses by 100 (forecast 0 one second earlier), then the forecast is right.
    # At quantile 1 the headroom is that miss x (1 - age / window): 100 x (1 - 50 / 100)
    # = 50 fifty seconds later, 1 at 99 s, gone at 100 s (out of the window); without the
    # fade 100 until it leaves the window.
    faded = ForecastErrors(horizon_s=1, window_s=100, quantile=1.0, smooth_s=1, fade=True)
    plain = ForecastErrors(horizon_s=1, window_s=100, quantile=1.0, smooth_s=1)
    for errors in (faded, plain):
        _naive(errors, [0.0] * 10)
        errors.record(100.0, 0.0)
    assert (faded.headroom(), plain.headroom()) == (100.0, 100.0)
    answers = {50: (50.0, 100.0), 99: (1.0, 100.0), 100: (0.0, 0.0)}
    for age in range(1, 101):
        for errors in (faded, plain):
            errors.record(0.0, 0.0)
        if age in answers:
            assert (faded.headroom(), plain.headroom()) == pytest.approx(answers[age])


def test_with_fade_a_recurring_miss_is_counted_afresh() -> None:
    # The same miss every 50 s: the newest one is at most 49 s old, so at quantile 1 the
    # headroom never falls below 100 x (1 - 49 / 100) = 51.
    errors = ForecastErrors(horizon_s=1, window_s=100, quantile=1.0, smooth_s=1, fade=True)
    lowest = math.inf
    for second in range(400):
        errors.record(100.0 if second % 50 == 0 else 0.0, 0.0)
        if second > 100:
            lowest = min(lowest, errors.headroom())
    assert lowest == pytest.approx(51.0)
