"""top's windowing math: histogram differences between scrapes and their percentiles, with
answers worked out by hand (Prometheus' histogram_quantile interpolation)."""

import pytest

from servepilot.engine.metrics import Histogram
from servepilot.observe.top.window import (
    EMPTY,
    Window,
    counter_delta,
    delta,
    percentiles_ms,
    quantile,
)

INF = float("inf")
# 10 observations up to 0.1 s, 20 more up to 0.2 s, 10 more up to 0.5 s.
FORTY = Histogram(buckets=((0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (INF, 40.0)), count=40.0, sum=6.0)


def test_quantiles_interpolate_inside_the_bucket_the_rank_falls_in() -> None:
    assert quantile(0.5, FORTY) == pytest.approx(0.15)  # rank 20: 10 of 20 into (0.1, 0.2]
    assert quantile(0.99, FORTY) == pytest.approx(0.488)  # rank 39.6: 9.6 of 10 into (0.2, 0.5]
    assert quantile(0.1, FORTY) == pytest.approx(0.04)  # the first bucket starts at 0
    assert quantile(1.0, FORTY) == pytest.approx(0.5)


def test_a_rank_in_the_inf_bucket_reads_as_the_largest_finite_bound() -> None:
    tail = Histogram(buckets=((0.1, 5.0), (INF, 10.0)), count=10.0, sum=9.0)
    assert quantile(0.99, tail) == 0.1


def test_no_observation_has_no_quantile() -> None:
    assert quantile(0.5, EMPTY) is None
    with pytest.raises(ValueError):
        quantile(1.5, FORTY)


def test_the_difference_of_two_scrapes_holds_only_the_new_observations() -> None:
    later = Histogram(buckets=((0.1, 10.0), (0.2, 35.0), (0.5, 45.0), (INF, 60.0)), count=60.0,
                      sum=12.0)  # fmt: skip
    new = delta(later, FORTY)
    assert new.buckets == ((0.1, 0.0), (0.2, 5.0), (0.5, 5.0), (INF, 20.0))
    assert (new.count, new.sum) == (20.0, 6.0)
    # 5 new up to 0.2 s, 5 up to 0.5 s, 10 above: the median is past every finite bound.
    assert quantile(0.5, new) == 0.5
    assert quantile(0.1, new) == pytest.approx(0.1 + 0.1 * 2 / 5)


def test_a_restarted_process_counts_everything_it_holds_as_new() -> None:
    restarted = Histogram(buckets=((0.1, 2.0), (INF, 2.0)), count=2.0, sum=0.1)
    assert delta(restarted, FORTY) == restarted
    assert counter_delta(3.0, 10.0) == 3.0
    assert counter_delta(12.0, 10.0) == 2.0


def test_percentiles_are_in_milliseconds() -> None:
    stats = percentiles_ms(FORTY)
    assert stats.p50_ms == pytest.approx(150.0)
    assert stats.p99_ms == pytest.approx(488.0)
    assert stats.count == 40


def test_the_window_keeps_one_sample_from_before_its_start_as_the_baseline() -> None:
    window: Window[int] = Window(window_s=60.0)
    assert window.ends() is None
    window.add(0.0, 0)
    assert window.ends() is None and window.span_s() == 0.0
    for second in range(1, 121):
        window.add(float(second), second)
    assert window.ends() == (60, 120)
    assert window.span_s() == 60.0
    window.add(120.5, 121)
    assert window.ends() == (60, 121)  # 60.5 is the start; 60 is the newest at or before it
