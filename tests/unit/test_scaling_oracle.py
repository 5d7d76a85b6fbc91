"""The clairvoyant reference (servepilot/scaling/oracle.py), with known answers: it sizes for
the highest known rate over the cold start and a tick ahead (no sooner, no later), gives
replicas back at once, stays within [min, max]; and the rate of a known schedule of sends."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from servepilot.core.errors import ConfigError
from servepilot.scaling.oracle import ClairvoyantPolicy, OracleSetup, schedule_rate
from servepilot.scaling.snapshot import FleetSnapshot, ScaleReason

HORIZON_S = 83.0  # the benchmark's: a 78 s cold start and a 5 s tick
NOTHING = FleetSnapshot(now_s=0.0, replicas=())


def _oracle(rate: Callable[[float], float], capacity_rps: float = 8.0) -> ClairvoyantPolicy:
    return ClairvoyantPolicy(rate, HORIZON_S, capacity_rps, 2, 20)


def _replicas(policy: ClairvoyantPolicy, now_s: float) -> int:
    return policy.decide(NOTHING, now_s).replicas


def test_a_step_up_is_provisioned_one_horizon_ahead_not_sooner() -> None:
    # 10 req/s, then 50 from t = 100, at 8 req/s a replica: ceil(10 / 8) = 2 until the
    # step is within 83 s (t >= 17), then ceil(50 / 8) = 7.
    oracle = _oracle(lambda t: 10.0 if t < 100.0 else 50.0)
    assert [_replicas(oracle, t) for t in (0.0, 16.0, 16.5, 17.0, 17.5, 100.0)] == [
        2, 2, 2, 7, 7, 7
    ]  # fmt: skip
    assert oracle.decide(NOTHING, 17.0).reason is ScaleReason.FORECAST


def test_replicas_are_given_back_as_soon_as_the_rate_falls() -> None:
    oracle = _oracle(lambda t: 50.0 if t < 100.0 else 10.0)
    assert [_replicas(oracle, t) for t in (0.0, 99.0, 99.5, 100.0)] == [7, 7, 7, 2]


def test_within_bounds() -> None:
    high, low = _oracle(lambda t: 200.0), _oracle(lambda t: 1.0)
    assert (high.decide(NOTHING, 0.0).replicas, low.decide(NOTHING, 0.0).replicas) == (20, 2)
    assert high.decide(NOTHING, 0.0).reason is ScaleReason.BOUNDS


def test_a_rate_of_exactly_k_replicas_needs_k() -> None:
    # 20.4 / (0.8 x 8.5) is 3 up to binary rounding: 3 replicas, not 4.
    assert _replicas(_oracle(lambda t: 20.4, 0.8 * 8.5), 0.0) == 3


def test_refuses_nonsense() -> None:
    with pytest.raises(ConfigError):
        ClairvoyantPolicy(lambda t: 1.0, HORIZON_S, 0.0, 2, 20)
    with pytest.raises(ConfigError):
        ClairvoyantPolicy(lambda t: 1.0, HORIZON_S, 8.0, 3, 2)


def test_a_schedules_rate_counts_the_sends_of_the_window_around_t() -> None:
    # 10 sends a second for 100 s, then 40 a second: a 30 s window reads 10, 40, and the
    # mix across the step.
    sends = [i / 10 for i in range(1000)] + [100 + i / 40 for i in range(4000)]
    rate = schedule_rate(sends, 30.0)
    assert rate(50.0) == pytest.approx(10.0)
    assert rate(150.0) == pytest.approx(40.0)
    assert rate(100.0) == pytest.approx(25.0)
    assert rate(-100.0) == 0.0


def test_the_setup_builds_an_oracle_of_the_levels_schedule_at_its_fill() -> None:
    sends = [i / 20 for i in range(20 * 600)]  # 20 req/s for 10 minutes
    oracle = OracleSetup(1, 10, replica_rps=5.0, horizon_s=83.0).build(sends)
    assert oracle.capacity_rps == 4.0  # 0.8 x 5
    assert _replicas(oracle, 100.0) == 5  # 20 / 4
    assert _replicas(oracle, 700.0) == 1  # nothing left to send: the minimum
    with pytest.raises(ConfigError, match="--replica-rps"):
        OracleSetup(1, 10, replica_rps=0.0, horizon_s=83.0)


def test_with_a_pool_it_starts_cold_only_what_the_pool_cannot_wake() -> None:
    # 10 req/s, then 50 from t = 100 (7 replicas at 8 a replica); a pool of 3 woken within
    # 10 s: until the step is within 10 s, 7 - 3 = 4 started a cold start ahead; then 7.
    oracle = ClairvoyantPolicy(
        lambda t: 10.0 if t < 100.0 else 50.0, HORIZON_S, 8.0, 2, 20, pool=3, wake_horizon_s=10.0
    )
    assert [_replicas(oracle, t) for t in (0.0, 17.0, 89.0, 90.0, 100.0)] == [2, 4, 4, 7, 7]
    with pytest.raises(ConfigError, match="wake horizon"):
        ClairvoyantPolicy(lambda t: 1.0, HORIZON_S, 8.0, 2, 20, pool=1, wake_horizon_s=90.0)
