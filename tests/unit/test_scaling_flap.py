"""The too-few memory (scaling.flap) on a ramp: the count the ramp found too few is noted at the
ramp's load, not at the minute's mean that still holds the lighter load before it."""

from __future__ import annotations

from servepilot.scaling.flap import TooFewMemory
from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample, ScaleDecision, ScaleReason


def _snapshot(replicas: int, arrivals_per_s: list[float]) -> FleetSnapshot:
    samples = tuple(ReplicaSample(f"r{i}", True, 0, 0, 0, 0.0, 0.0, 4) for i in range(replicas))
    return FleetSnapshot(now_s=float(len(arrivals_per_s)), replicas=samples,
                         arrivals_per_s=tuple(arrivals_per_s))  # fmt: skip


def test_a_count_too_few_for_a_ramp_does_not_hold_the_fleet_up_after_it() -> None:
    memory = TooFewMemory()
    light = [2.5] * 59
    # One second into a ramp from 2.5 to 15 req/s (the step rules' first tick), one replica
    # is too few: the minute's mean is 2.71 req/s, the load it was too few for 15.
    memory.steady(_snapshot(1, [*light, 15.0]), ScaleDecision(2, ScaleReason.UP))
    # A minute after the ramp, back at 2.5 req/s (over 90% of that minute's mean): going back
    # to one replica is allowed.
    after = _snapshot(2, [*light, 15.0, *[15.0] * 20, *[2.5] * 60])
    kept = memory.steady(after, ScaleDecision(1, ScaleReason.DOWN))
    assert kept.replicas == 1 and kept.reason is ScaleReason.DOWN


def test_a_count_too_few_just_after_a_start_is_not_noted() -> None:
    # Eight seconds of arrivals since the gateway started, a ramp in the last three.
    memory = TooFewMemory()
    memory.steady(_snapshot(1, [0.0] * 5 + [11.0] * 3), ScaleDecision(2, ScaleReason.UP))
    after = _snapshot(2, [3.0] * 60)
    assert memory.steady(after, ScaleDecision(1, ScaleReason.DOWN)).replicas == 1


def test_on_a_flat_load_the_count_stays_noted_at_the_minutes_mean() -> None:
    memory = TooFewMemory()
    flat = [15.0, 14.0, 16.0] * 20
    memory.steady(_snapshot(3, flat), ScaleDecision(4, ScaleReason.UP))
    # The same load later: three replicas stay too few.
    kept = memory.steady(_snapshot(4, flat), ScaleDecision(3, ScaleReason.DOWN))
    assert kept.replicas == 4 and kept.reason is ScaleReason.TOO_FEW
