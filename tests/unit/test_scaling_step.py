"""The seeds' step rules, every rule with a known answer: +10% above 80%, -5% below 50%, at
least one replica a step, [min, max], cool-downs, the removal check, stale gauges, the freeze
while replicas start."""

from __future__ import annotations

import pytest

from servepilot.core.errors import ConfigError
from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample, ScaleDecision, ScaleReason
from servepilot.scaling.step import StepPolicy, StepRules

NO_COOL_DOWN = StepRules(min_replicas=1, max_replicas=40, up_cooldown_s=0, down_cooldown_s=0)


def _snap(
    now_s: float, ready: int, utilisation: float, *, starting: int = 0, age_s: float = 1.0
) -> FleetSnapshot:
    """`ready` replicas each with `utilisation` of a budget of 100 in flight."""
    busy = round(utilisation * 100)
    replicas = [ReplicaSample(f"r{i}", True, busy, busy, 0, 0.0, age_s, 100) for i in range(ready)]
    replicas += [ReplicaSample(f"s{i}", False, 0, 0, 0, 0.0, 0.0, 100) for i in range(starting)]
    return FleetSnapshot(now_s, tuple(replicas))


def _decide(policy: StepPolicy, now_s: float, ready: int, utilisation: float) -> ScaleDecision:
    return policy.decide(_snap(now_s, ready, utilisation), now_s)


@pytest.mark.parametrize(
    ("replicas", "up", "down"),
    [(0, 1, 1), (3, 1, 1), (10, 1, 1), (11, 2, 1), (20, 2, 1), (30, 3, 1), (39, 4, 1), (40, 4, 2)],
)
def test_step_sizes_round_to_whole_replicas_at_least_one(replicas: int, up: int, down: int) -> None:
    # 10% of 3 is one replica, 10% of 11 two; 5% of 39 one, 5% of 40 two.
    rules = StepRules()
    assert (rules.step_up(replicas), rules.step_down(replicas)) == (up, down)


def test_a_share_that_binary_floats_miss_still_rounds_right() -> None:
    # 0.07 x 100 is 7.000000000000001 in binary floating point: ceil would make it 8.
    assert StepRules(up_share=0.07).step_up(100) == 7


def test_above_the_upper_line_adds_ten_percent_and_one_at_small_fleets() -> None:
    policy = StepPolicy(NO_COOL_DOWN)
    assert _decide(policy, 0, 3, 0.85) == ScaleDecision(
        4, ScaleReason.UP, _decide_detail(0.85, 3, "> 0.8")
    )
    assert _decide(StepPolicy(NO_COOL_DOWN), 0, 11, 0.9).replicas == 13


def _decide_detail(peak: float, replicas: int, tail: str) -> str:
    return f"peak utilisation {peak:.2f} over 60 s, {replicas} replicas {tail}"


def test_between_the_lines_holds() -> None:
    for utilisation in (0.5, 0.65, 0.8):
        decision = _decide(StepPolicy(NO_COOL_DOWN), 0, 5, utilisation)
        assert (decision.replicas, decision.reason) == (5, ScaleReason.HOLD)


def test_below_the_lower_line_removes_five_percent() -> None:
    decision = _decide(StepPolicy(NO_COOL_DOWN), 0, 40, 0.3)
    assert (decision.replicas, decision.reason) == (38, ScaleReason.DOWN)
    assert decision.detail.endswith("0.32 after")  # 0.3 x 40 / 38


def test_removal_check_keeps_a_replica_the_rest_could_not_carry() -> None:
    # 2 replicas at 0.45: without one, the other carries 0.9 >= 0.8.
    decision = _decide(StepPolicy(NO_COOL_DOWN), 0, 2, 0.45)
    assert (decision.replicas, decision.reason) == (2, ScaleReason.REMOVAL_CHECK)
    # 3 at 0.45: the 2 left carry 0.675 < 0.8.
    assert _decide(StepPolicy(NO_COOL_DOWN), 0, 3, 0.45).replicas == 2
    # 5 at 0.49: 4 left at 0.6125.
    assert _decide(StepPolicy(NO_COOL_DOWN), 0, 5, 0.49).replicas == 4


def test_min_and_max_bound_every_answer() -> None:
    rules = StepRules(min_replicas=2, max_replicas=20, up_cooldown_s=0, down_cooldown_s=0)
    assert _decide(StepPolicy(rules), 0, 1, 0.6) == ScaleDecision(
        2, ScaleReason.BOUNDS, "1 outside [2, 20]"
    )
    assert _decide(StepPolicy(rules), 0, 20, 0.99).reason is ScaleReason.BOUNDS
    assert _decide(StepPolicy(rules), 0, 20, 0.99).replicas == 20
    assert _decide(StepPolicy(rules), 0, 19, 0.99).replicas == 20  # +2 capped at 20
    assert _decide(StepPolicy(rules), 0, 2, 0.1).replicas == 2  # at min


def test_up_cool_down_counts_from_the_last_change() -> None:
    policy = StepPolicy(StepRules(up_cooldown_s=60, down_cooldown_s=300))
    assert _decide(policy, 0, 3, 0.9).replicas == 4
    held = _decide(policy, 30, 4, 0.9)
    assert (held.replicas, held.reason) == (4, ScaleReason.COOL_DOWN)
    assert _decide(policy, 59.9, 4, 0.9).reason is ScaleReason.COOL_DOWN
    assert _decide(policy, 60, 4, 0.9).replicas == 5


def test_down_cool_down_is_longer_and_counts_from_any_change() -> None:
    policy = StepPolicy(StepRules(up_cooldown_s=60, down_cooldown_s=300, window_s=0))
    assert _decide(policy, 0, 3, 0.9).replicas == 4
    assert _decide(policy, 100, 4, 0.2).reason is ScaleReason.COOL_DOWN
    assert _decide(policy, 299, 4, 0.2).reason is ScaleReason.COOL_DOWN
    assert _decide(policy, 300, 4, 0.2).replicas == 3
    # Someone else (a forecast) set 6: the cool-down restarts from that tick.
    assert _decide(policy, 700, 6, 0.2).reason is ScaleReason.COOL_DOWN
    assert _decide(policy, 1000, 6, 0.2).replicas == 5


def test_the_peak_of_the_last_minute_decides_not_the_last_look() -> None:
    policy = StepPolicy(NO_COOL_DOWN)
    assert _decide(policy, 0, 4, 0.7).reason is ScaleReason.HOLD
    assert _decide(policy, 30, 4, 0.2).reason is ScaleReason.HOLD  # 0.7 30 s ago
    assert _decide(policy, 61, 4, 0.2).replicas == 3


def test_stale_gauges_count_as_full() -> None:
    policy = StepPolicy(NO_COOL_DOWN)
    idle_but_blind = policy.decide(_snap(0, 4, 0.0, age_s=31.0), 0)
    assert (idle_but_blind.replicas, idle_but_blind.reason) == (5, ScaleReason.UP)


def test_no_step_while_replicas_start() -> None:
    policy = StepPolicy(NO_COOL_DOWN)
    frozen = policy.decide(_snap(0, 3, 0.95, starting=1), 0)
    assert frozen == ScaleDecision(4, ScaleReason.STARTING, "1 still starting")
    assert policy.decide(_snap(5, 3, 0.1, starting=1), 5).replicas == 4
    assert policy.decide(_snap(70, 4, 0.95), 70).replicas == 5


def test_rules_refuse_crossed_lines_and_bounds() -> None:
    with pytest.raises(ConfigError):
        StepRules(lower=0.8, upper=0.5)
    with pytest.raises(ConfigError):
        StepRules(min_replicas=5, max_replicas=4)


@pytest.mark.parametrize(
    ("ready", "utilisation", "floor"),
    [(10, 0.3, 4), (10, 0.4, 6), (20, 0.1, 3), (10, 0.9, 10), (0, 0.0, 0)],
)
def test_the_load_floor_is_the_removal_check_for_many_at_once(
    ready: int, utilisation: float, floor: int
) -> None:
    # 0.3 x 10 / 0.8 = 3.75: 4 left carry 0.75 < 0.8, 3 would carry 1.0. 0.4 x 10 / 0.8 = 5:
    # on 5 exactly 0.8, not under it, so 6. Above the line every ready replica stays; the
    # starting ones carry no load and go first.
    policy = StepPolicy(NO_COOL_DOWN)
    snapshot = _snap(0, ready, utilisation, starting=2)
    policy.decide(snapshot, 0)
    assert policy.load_floor(snapshot) == floor
