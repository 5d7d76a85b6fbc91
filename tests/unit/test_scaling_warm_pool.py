import pytest

from servepilot.scaling.warm_pool import PoolCounts, PoolPlan, plan_pool


def test_up_wakes_before_starting_cold() -> None:
    plan = plan_pool(PoolCounts(active=2, asleep=3), desired_active=4, pool_target=3)
    # Two woken; the pool (now 1) is refilled by two cold starts that will sleep.
    assert plan == PoolPlan(wake=2, refill=2)


def test_up_beyond_the_pool_starts_the_rest_cold() -> None:
    plan = plan_pool(PoolCounts(active=2, asleep=1), desired_active=6, pool_target=1)
    assert plan == PoolPlan(wake=1, start=3, refill=1)


def test_down_sleeps_into_the_pool_then_stops() -> None:
    plan = plan_pool(PoolCounts(active=6, asleep=1), desired_active=2, pool_target=3)
    assert plan == PoolPlan(sleep=2, stop=2)


def test_refilling_replicas_count_towards_the_pool() -> None:
    plan = plan_pool(PoolCounts(active=5, asleep=1, refilling=1), desired_active=3, pool_target=3)
    assert plan == PoolPlan(sleep=1, stop=1)


def test_steady_full_pool_does_nothing() -> None:
    plan = plan_pool(PoolCounts(active=3, asleep=2), desired_active=3, pool_target=2)
    assert plan.idle
    assert plan.describe() == "nothing"


def test_pool_above_target_drops_sleepers() -> None:
    plan = plan_pool(PoolCounts(active=3, asleep=4), desired_active=3, pool_target=1)
    assert plan == PoolPlan(drop_asleep=3)


def test_no_pool_is_plain_cold_starts_and_stops() -> None:
    assert plan_pool(PoolCounts(active=1, asleep=0), 4, 0) == PoolPlan(start=3)
    assert plan_pool(PoolCounts(active=4, asleep=0), 1, 0) == PoolPlan(stop=3)
    assert plan_pool(PoolCounts(active=2, asleep=2), 2, 0) == PoolPlan(drop_asleep=2)


def test_describe_names_the_actions() -> None:
    assert PoolPlan(wake=1, refill=2).describe() == "wake 1, refill 2"


def test_negative_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="asleep"):
        PoolCounts(active=1, asleep=-1)
    with pytest.raises(ValueError, match="pool_target"):
        plan_pool(PoolCounts(1, 0), 1, -1)


def test_without_cold_refills_the_pool_refills_only_by_sleeps() -> None:
    # Two woken of two: nothing started cold to refill the pool ...
    assert plan_pool(PoolCounts(2, 2), 4, 2, cold_refill=False) == PoolPlan(wake=2)
    # ... until replicas are given back: they sleep into it, the rest stop.
    assert plan_pool(PoolCounts(4, 0), 1, 2, cold_refill=False) == PoolPlan(sleep=2, stop=1)
    assert plan_pool(PoolCounts(4, 0), 1, 2) == PoolPlan(sleep=2, stop=1)
    assert plan_pool(PoolCounts(2, 2), 4, 2) == PoolPlan(wake=2, refill=2)
