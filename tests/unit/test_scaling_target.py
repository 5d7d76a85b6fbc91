"""The HPA-like `target` baseline: a share of the concurrency budgets in use."""

from __future__ import annotations

from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample, ScaleReason
from servepilot.scaling.target_utilisation import TargetUtilisation


def _snap(now_s: float, in_flight: int) -> FleetSnapshot:
    replicas = tuple(
        ReplicaSample(f"r{i}", True, in_flight // 2, 0, 0, 0.0, 0.0, budget=10) for i in range(2)
    )
    return FleetSnapshot(now_s, replicas)


def test_target_utilisation_scales_up_at_once_and_down_after_the_window() -> None:
    policy = TargetUtilisation(target=0.5, min_replicas=1, max_replicas=10, scale_down_window_s=60)
    first = policy.decide(_snap(0, 40), 0)
    assert (first.replicas, first.reason) == (8, ScaleReason.TARGET)  # 40 / (0.5 x 10)
    assert policy.decide(_snap(30, 4), 30).replicas == 8  # a dip inside the window
    assert policy.decide(_snap(61, 4), 61).replicas == 1
    assert policy.decide(_snap(62, 500), 62).replicas == 10  # capped
