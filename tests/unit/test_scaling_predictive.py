"""The forecast ahead of the cold start: Holt's trend with known answers on a ramp, a step
change and damped; the predictive policy's sizing (with the forecast's error headroom), never
below the step rules on the way up, and its giving back: at once, down to the forecast's need
once it has stayed lower for a while, never below the removal check's floor."""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import pytest

from servepilot.core.errors import ConfigError
from servepilot.scaling.forecast import HoltForecast
from servepilot.scaling.predictive import ForecastSizing, PredictivePolicy
from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample, ScaleReason
from servepilot.scaling.step import StepRules

RULES = StepRules(min_replicas=2, max_replicas=20, up_cooldown_s=0, down_cooldown_s=0)


def test_a_linear_ramp_is_forecast_within_half_a_percent() -> None:
    holt = HoltForecast(alpha=0.1, beta=0.01)
    for t in range(601):
        holt.observe(10.0 + 0.1 * t)
    # 90 s past the last observation (t = 600): 10 + 0.1 x 690 = 79.
    assert holt.forecast(90.0) == pytest.approx(79.0, rel=0.005)
    assert holt.trend == pytest.approx(0.1, rel=0.01)


def test_a_step_change_converges_within_five_percent() -> None:
    # 10 -> 50 req/s. Without a trend the level alone would take 27 ticks (0.9^n x 40 <=
    # 2.5); the trend it learns from the jump gets there in 21, overshoots past 5% for a
    # while, and stays within 5% from tick 58 on (the policy's alpha 0.1, beta 0.01).
    holt = HoltForecast(alpha=0.1, beta=0.01)
    for _ in range(300):
        holt.observe(10.0)
    errors = []
    for _ in range(600):
        holt.observe(50.0)
        errors.append(abs(holt.forecast(0.0) - 50.0) / 50.0)
    first = 1 + min(i for i, e in enumerate(errors) if e <= 0.05)
    settled = 2 + max(i for i, e in enumerate(errors) if e > 0.05)
    assert (first, settled) == (21, 58)
    assert max(errors[first:]) < 0.15  # the overshoot stays under 15%
    assert errors[-1] < 1e-3


def test_forecast_before_any_observation_is_zero_and_never_negative() -> None:
    holt = HoltForecast()
    assert holt.forecast(60.0) == 0.0
    holt.observe(5.0)
    holt.observe(0.0)  # a falling trend
    assert holt.forecast(1e6) == 0.0
    assert holt.peak(60.0) == holt.forecast(0.0)


def test_a_damped_trend_bends_towards_a_level() -> None:
    # alpha = beta = 1: the level is the last value, the trend the last change (10);
    # damping 0.5 adds 0.5, 0.75, ... of it: at most 1 x 10 however far ahead.
    holt = HoltForecast(alpha=1.0, beta=1.0, damping=0.5)
    holt.observe(0.0)
    holt.observe(10.0)
    assert (holt.level, holt.trend) == (10.0, 10.0)
    assert [holt.forecast(h) for h in (0.0, 1.0, 2.0)] == [10.0, 15.0, 17.5]
    assert holt.forecast(1000.0) == pytest.approx(20.0)
    assert holt.peak(2.0) == 17.5
    # The same series undamped: a straight line.
    line = HoltForecast(alpha=1.0, beta=1.0)
    line.observe(0.0)
    line.observe(10.0)
    assert line.forecast(2.0) == 30.0
    with pytest.raises(ConfigError):
        HoltForecast(damping=0.0)


def _snap(now_s: float, ready: int, arrivals: tuple[float, ...], busy: int = 60) -> FleetSnapshot:
    replicas = tuple(
        ReplicaSample(f"r{i}", True, busy, busy, 0, 0.0, 1.0, 100) for i in range(ready)
    )
    return FleetSnapshot(now_s, replicas, arrivals_per_s=arrivals)


def test_the_fleet_is_sized_for_the_forecast_at_fill() -> None:
    # 40 req/s steady, 5 req/s a replica at fill 0.8: ceil(40 / 4) = 10.
    policy = PredictivePolicy(ForecastSizing(replica_rps=5.0, horizon_s=90.0), RULES)
    decision = policy.decide(_snap(60.0, 4, (40.0,) * 60), 60.0)
    assert (decision.replicas, decision.reason) == (10, ScaleReason.FORECAST)
    assert decision.detail.startswith(
        "forecast 40.0 + 0.0 req/s error headroom within 90 s needs 10"
    )


def test_a_ramp_is_sized_for_the_end_of_the_horizon() -> None:
    policy = PredictivePolicy(ForecastSizing(replica_rps=5.0, horizon_s=90.0), RULES)
    ramp = tuple(10.0 + 0.1 * t for t in range(600))
    decision = policy.decide(_snap(600.0, 4, ramp), 600.0)
    # The ramp at 599 + 90 s: 10 + 0.1 x 689 = 78.9 req/s; / 4 = 19.7 -> 20.
    assert decision.replicas == 20


def test_never_below_the_step_rules_and_within_max() -> None:
    policy = PredictivePolicy(ForecastSizing(replica_rps=5.0, horizon_s=90.0), RULES)
    # Little traffic but replicas full: the rules' +10% wins over the forecast's 2.
    decision = policy.decide(_snap(10.0, 10, (1.0,) * 10, busy=95), 10.0)
    assert (decision.replicas, decision.reason) == (11, ScaleReason.UP)
    flood = PredictivePolicy(ForecastSizing(replica_rps=5.0, horizon_s=90.0), RULES)
    assert flood.decide(_snap(10.0, 4, (1000.0,) * 10), 10.0).replicas == 20


def test_each_second_is_fed_once() -> None:
    policy = PredictivePolicy(ForecastSizing(replica_rps=5.0, horizon_s=90.0), RULES)
    history = tuple(float(v) for v in range(10))
    policy.decide(_snap(10.0, 4, history), 10.0)
    assert policy.forecast.observed == 10
    policy.decide(_snap(10.5, 4, history), 10.5)  # same second: nothing new
    assert policy.forecast.observed == 10
    policy.decide(_snap(13.0, 4, (*history[3:], 1.0, 2.0, 3.0)), 13.0)
    assert policy.forecast.observed == 13


NAIVE = {"alpha": 1.0, "beta": 0.0, "error_quantile": None}
"""The forecast is the last second's arrivals, without headroom: needs with known answers."""


def test_replicas_are_given_back_at_once_once_the_need_stayed_lower() -> None:
    # 80 req/s: 80 / (0.8 x 5) = 20 replicas. Then 20 req/s: 5. The need stays 20 for the
    # hold (60 s); then all 15 replicas go in one decision, not one a minute. Utilisation
    # 0.1 lets the removal check go to 3 (0.1 x 20 / 3 = 0.67 < 0.8).
    policy = PredictivePolicy(ForecastSizing(5.0, 90.0, hold_s=60.0, **NAIVE), RULES)
    assert policy.decide(_snap(60.0, 20, (80.0,) * 60, busy=10), 60.0).replicas == 20
    low = (80.0,) * 60 + (20.0,) * 60
    held = policy.decide(_snap(100.0, 20, low[:100], busy=10), 100.0)
    # The rules would step down (utilisation 0.1 < 0.5): the forecast's need holds them.
    assert (held.replicas, held.reason) == (20, ScaleReason.FORECAST)
    assert held.detail.endswith("needs 5 at 0.8 x 5 req/s, 20 at most over 60 s (rules: 19)")
    assert policy.decide(_snap(115.0, 20, low[:115], busy=10), 115.0).replicas == 20
    given = policy.decide(_snap(121.0, 20, low[1:121], busy=10), 121.0)
    assert (given.replicas, given.reason) == (5, ScaleReason.FORECAST)


def test_a_fall_the_forecast_carries_skips_the_hold() -> None:
    # The forecast is the last second's arrivals and its trend the last change (alpha = beta
    # = 1): 80 req/s (20 replicas at 0.8 x 5), then down 1 req/s a second. At 70 s the
    # forecast falls 70 req/s over the horizon (to 0), more than a replica's worth (4): the
    # hold is skipped, ceil(70 / 4) = 18 at once; holding, the need of 60 s stays 20.
    sizing = ForecastSizing(5.0, 90.0, alpha=1.0, beta=1.0, error_quantile=None, hold_s=60.0)
    fall = (80.0,) * 60 + tuple(80.0 - s for s in range(1, 11))
    answers = []
    for release in (1.0, None):
        policy = PredictivePolicy(replace(sizing, fall_release=release), RULES)
        policy.decide(_snap(60.0, 20, fall[:60], busy=10), 60.0)
        answers.append(policy.decide(_snap(70.0, 20, fall, busy=10), 70.0).replicas)
    assert answers == [18, 20]
    assert ForecastSizing(5.0, 90.0).fall_release == 1.0  # the default


def test_a_fall_under_the_release_keeps_the_hold() -> None:
    # Down 0.04 req/s a second: 3.6 req/s over the 90 s horizon, under one replica's worth
    # (4). At 130 s (77.2 req/s) the need is still 20; at 160 s (76 req/s) 19, but the hold
    # keeps 20 with a release of one replica, and gives it back with a release of 0.
    sizing = ForecastSizing(5.0, 90.0, alpha=1.0, beta=1.0, error_quantile=None, hold_s=60.0)
    gentle = (80.0,) * 60 + tuple(80.0 - 0.04 * s for s in range(1, 101))
    answers = []
    for release in (1.0, 0.0):
        policy = PredictivePolicy(replace(sizing, fall_release=release), RULES)
        for now in (60, 130, 160):
            last = policy.decide(_snap(float(now), 20, gentle[:now], busy=10), float(now))
        answers.append(last.replicas)
    assert answers == [20, 19]


def test_giving_back_stops_at_the_removal_checks_floor() -> None:
    # Utilisation 0.3 on 20 ready: 0.3 x 20 / 0.8 = 7.5, so 8 must stay (0.75 < 0.8 on 8;
    # 0.86 on 7), whatever the forecast says.
    policy = PredictivePolicy(ForecastSizing(5.0, 90.0, hold_s=0.0, **NAIVE), RULES)
    decision = policy.decide(_snap(60.0, 20, (4.0,) * 60, busy=30), 60.0)
    assert (decision.replicas, decision.reason) == (8, ScaleReason.FORECAST)


def test_error_headroom_sizes_for_what_the_forecast_missed() -> None:
    # A naive forecast of 40 req/s made 90 s before each of 600 seconds of 80 req/s misses
    # by 40 (the 15 s mean is 80 from the 15th second on; the first 14 still hold some 40s,
    # so the window's mean rate is 80 - 280 / 600 = 79.53). The headroom is that 40 less
    # what Poisson noise puts at the 95th percentile of a 15 s mean at that rate, 1.645 x
    # sqrt(79.53 / 15) = 3.8: 36.2, and (80 + 36.2) / 4 -> 30, max 20. With the forecast
    # right for 600 s after that, none is left (and utilisation 0.1 lets the removal check
    # go that low). Unfaded: the errors as they were measured, whatever their age.
    sizing = ForecastSizing(5.0, 90.0, alpha=1.0, beta=0.0, hold_s=0.0, error_fade=False)
    policy = PredictivePolicy(sizing, RULES)
    policy.decide(_snap(90.0, 4, (40.0,) * 90), 90.0)
    decision = policy.decide(_snap(690.0, 4, (80.0,) * 600), 690.0)
    noise = NormalDist().inv_cdf(0.95) * math.sqrt((80.0 - 280.0 / 600.0) / 15.0)
    assert policy.errors is not None and policy.errors.headroom() == pytest.approx(40.0 - noise)
    assert decision.replicas == 20
    smooth = PredictivePolicy(sizing, StepRules(min_replicas=2, max_replicas=40))
    smooth.decide(_snap(90.0, 4, (40.0,) * 90), 90.0)
    assert smooth.decide(_snap(690.0, 4, (80.0,) * 600), 690.0).replicas == 30
    calm = smooth.decide(_snap(1380.0, 30, (80.0,) * 600, busy=10), 1380.0)
    assert (smooth.errors is not None and smooth.errors.headroom(), calm.replicas) == (0.0, 20)


def test_by_default_a_one_off_miss_fades_with_its_age() -> None:
    # The miss of the test above 300 to 389 s old, in a window of 390 errors: the 95th
    # percentile (nearest rank: the 20th highest) of the faded errors is the one 319 s old,
    # 40 x (1 - 319 / 600) = 18.73, less the noise at 80 - 280 / 390 = 79.28 req/s (1.645 x
    # sqrt(79.28 / 15) = 3.78): 14.95 req/s of headroom, (80 + 14.95) / 4 -> 24 replicas.
    # Unfaded: 40 - 3.78 = 36.22, and 30.
    rules = StepRules(min_replicas=2, max_replicas=40)
    sizing = ForecastSizing(5.0, 90.0, alpha=1.0, beta=0.0, hold_s=0.0)
    faded = PredictivePolicy(sizing, rules)
    plain = PredictivePolicy(replace(sizing, error_fade=False), rules)
    answers = []
    for policy in (faded, plain):
        policy.decide(_snap(90.0, 4, (40.0,) * 90), 90.0)
        decision = policy.decide(_snap(480.0, 4, (80.0,) * 390), 480.0)
        assert policy.errors is not None
        answers.append((round(policy.errors.headroom(), 2), decision.replicas))
    assert answers == [(14.95, 24), (36.22, 30)]


def test_sizing_refuses_nonsense() -> None:
    with pytest.raises(ConfigError):
        ForecastSizing(replica_rps=0.0, horizon_s=90.0)
    with pytest.raises(ConfigError):
        ForecastSizing(replica_rps=1.0, horizon_s=90.0, fill=1.5)
    with pytest.raises(ConfigError):
        ForecastSizing(replica_rps=1.0, horizon_s=90.0, fall_release=-1.0)
    assert math.isfinite(ForecastSizing(replica_rps=1.0, horizon_s=1.0).fill)


def test_with_a_pool_only_the_need_beyond_it_is_started_a_cold_start_ahead() -> None:
    # A ramp of +0.5 req/s each second from 10 req/s, on a fleet that has what it asked for
    # (nothing starting, half utilised): the pool of 3 wakes in time what the ramp needs within
    # the wake horizon, so the policy asks for at most 3 fewer than without it, never more,
    # and fewer once the cold horizon's need runs ahead of the wake horizon's.
    sizing = ForecastSizing(6.0, 83.0, error_quantile=None)
    plain = PredictivePolicy(sizing, RULES)
    pooled = PredictivePolicy(replace(sizing, pool=3, wake_horizon_s=5.8), RULES)
    have_plain = have_pooled = 2
    gaps = []
    for tick in range(1, 61):
        now = tick * 5.0
        arrivals = tuple(10.0 + 0.5 * s for s in range(int(now)))
        a = plain.decide(_fleet(have_plain, arrivals, now), now).replicas
        b = pooled.decide(_fleet(have_pooled, arrivals, now), now).replicas
        have_plain, have_pooled = a, b
        gaps.append(a - b)
    assert all(0 <= gap <= 3 for gap in gaps)
    assert max(gaps) == 3
    with pytest.raises(ConfigError, match="wake horizon"):
        ForecastSizing(6.0, 83.0, pool=1, wake_horizon_s=90.0)


def _fleet(replicas: int, arrivals: tuple[float, ...], now: float) -> FleetSnapshot:
    samples = tuple(
        ReplicaSample(
            f"r{i}",
            ready=True,
            in_flight=4,
            running=4,
            waiting=0,
            kv_usage=0.1,
            metrics_age_s=0.0,
            budget=8,
        )
        for i in range(replicas)
    )
    return FleetSnapshot(now_s=now, replicas=samples, arrivals_per_s=arrivals)


def test_with_a_pool_a_burst_the_forecast_lags_is_woken_for_at_once() -> None:
    # 20 req/s for ten minutes, then 60 req/s for the last 5 s: Holt's level has closed only
    # about 40% of the gap, but the last 5 s stand 40 req/s above it, far beyond the Poisson
    # noise of 5 s at 20 req/s (3 sigmas: 6 req/s). The pool (wakes in 5.8 s) is asked for
    # 60 req/s at once: ceil(60 / (0.8 x 6)) = 13; without a pool, the forecast alone.
    sizing = ForecastSizing(6.0, 83.0, error_quantile=None)
    arrivals = (20.0,) * 600 + (60.0,) * 5
    pooled = PredictivePolicy(replace(sizing, pool=10, wake_horizon_s=5.8), RULES)
    assert pooled.decide(_fleet(5, arrivals, 605.0), 605.0).replicas == 13
    off = PredictivePolicy(replace(sizing, pool=10, wake_horizon_s=5.8, burst_window_s=None), RULES)
    plain = PredictivePolicy(sizing, RULES)
    assert off.decide(_fleet(5, arrivals, 605.0), 605.0).replicas < 13
    assert plain.decide(_fleet(5, arrivals, 605.0), 605.0).replicas < 13
    # Noise is no burst: seconds of 20 +- 4 req/s (within 3 sigmas of 5 s) change nothing.
    noisy = (20.0,) * 600 + (24.0, 16.0, 24.0, 24.0, 24.0)
    quiet = PredictivePolicy(replace(sizing, pool=10, wake_horizon_s=5.8), RULES)
    calm = PredictivePolicy(
        replace(sizing, pool=10, wake_horizon_s=5.8, burst_window_s=None), RULES
    )
    assert (
        quiet.decide(_fleet(5, noisy, 605.0), 605.0).replicas
        == calm.decide(_fleet(5, noisy, 605.0), 605.0).replicas
    )
    with pytest.raises(ConfigError, match="burst_window_s"):
        ForecastSizing(6.0, 83.0, burst_window_s=0)


def _every_second(policy: PredictivePolicy, tail: tuple[float, ...]) -> list[int]:
    """Ten minutes at 26 req/s on 4 replicas (the line of 4 at 0.8 x 8.5: 27.2 req/s), then
    `tail`, a decision every second (a pool's tick): the replicas asked for at each."""
    arrivals = (26.0,) * 600
    for now in range(590, 601):  # it has been deciding every second before
        assert policy.decide(_fleet(4, arrivals[:now], now), now).replicas == 4
    asked = []
    for k, value in enumerate(tail, start=1):
        arrivals += (value,)
        asked.append(policy.decide(_fleet(4, arrivals, 600.0 + k), 600.0 + k).replicas)
    return asked


def test_with_a_pool_the_forecast_wakes_only_once_it_asked_for_a_while() -> None:
    sizing = replace(ForecastSizing(8.5, 79.0, error_quantile=None), pool=10, wake_horizon_s=1.8)
    eager = replace(sizing, wake_confirm_s=0.0)
    assert sizing.wake_confirm_s == 4.0
    # One second of 40 req/s lifts Holt's level from 26 to 27.4, over the line for two
    # seconds: noise a decision every second reads and one every 5 s mostly misses. No wake.
    spike = (40.0,) + (26.0,) * 6
    assert _every_second(PredictivePolicy(eager, RULES), spike)[:2] == [5, 5]
    assert _every_second(PredictivePolicy(sizing, RULES), spike) == [4] * 7
    # 32 req/s that lasts: the level crosses the line at the third second, and the wake
    # follows once it has asked for 4 s.
    rise = (32.0,) * 10
    first = _every_second(PredictivePolicy(eager, RULES), rise).index(5)
    assert first == 2
    assert _every_second(PredictivePolicy(sizing, RULES), rise).index(5) == first + 4
    # A burst (60 req/s) is the burst rule's: its own 3-sigma test wakes at once, by the
    # third second (the last 5 s at 46.4 req/s against the level's 35.2 + 3 x 2.65).
    # Without the burst rule, the forecast's need waits its 4 s like any other.
    assert _every_second(PredictivePolicy(sizing, RULES), (60.0,) * 3) == [4, 4, 7]
    no_rule = replace(sizing, burst_window_s=None)
    assert _every_second(PredictivePolicy(no_rule, RULES), (60.0,) * 3) == [4, 4, 4]
    with pytest.raises(ConfigError, match="wake_confirm_s"):
        ForecastSizing(6.0, 83.0, wake_confirm_s=-1.0)
