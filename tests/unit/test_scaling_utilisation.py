"""Utilisation, defined once: per replica max(in flight / budget, waiting / 5, kv / 0.8), stale
gauges full; the fleet's is the ready replicas' mean, read as its peak over a window."""

from __future__ import annotations

import pytest

from servepilot.scaling.arrivals import ArrivalHistory
from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample
from servepilot.scaling.utilisation import (
    PeakWindow,
    UtilisationLimits,
    fleet_utilisation,
    replica_utilisation,
)

LIMITS = UtilisationLimits(queue_threshold=5, kv_full=0.8, stale_after_s=30.0)


def _replica(
    in_flight: int = 0,
    waiting: int = 0,
    kv: float = 0.0,
    age_s: float = 1.0,
    ready: bool = True,
    budget: int = 10,
) -> ReplicaSample:
    return ReplicaSample("r", ready, in_flight, 0, waiting, kv, age_s, budget)


@pytest.mark.parametrize(
    ("replica", "expected"),
    [
        (_replica(in_flight=6), 0.6),  # 6 of a budget of 10
        (_replica(in_flight=2, waiting=4), 0.8),  # 4 waiting of 5
        (_replica(in_flight=2, kv=0.6), 0.75),  # 0.6 of 0.8
        (_replica(waiting=10), 2.0),  # more than full
        (_replica(in_flight=0, age_s=31.0), 1.0),  # stale: full, however idle it looked
        (_replica(in_flight=0, age_s=30.0), 0.0),  # at the bound: still fresh
    ],
)
def test_replica_utilisation_known_answers(replica: ReplicaSample, expected: float) -> None:
    assert replica_utilisation(replica, LIMITS) == pytest.approx(expected)


def test_fleet_utilisation_is_the_mean_over_ready_replicas() -> None:
    replicas = (_replica(in_flight=8), _replica(in_flight=2), _replica(ready=False))
    assert fleet_utilisation(FleetSnapshot(0.0, replicas), LIMITS) == pytest.approx(0.5)


def test_a_fleet_with_none_ready_is_full_only_when_requests_wait() -> None:
    starting = (_replica(ready=False),)
    assert fleet_utilisation(FleetSnapshot(0.0, starting), LIMITS) == 0.0
    waiting = FleetSnapshot(0.0, (), queued_by_class=(0, 3, 0))
    assert fleet_utilisation(waiting, LIMITS) == 1.0


def test_peak_window_keeps_the_highest_of_the_last_minute() -> None:
    peak = PeakWindow(60.0)
    assert peak.add(0.0, 0.9) == 0.9
    assert peak.add(30.0, 0.2) == 0.9
    assert peak.add(60.0, 0.3) == 0.9  # 0.9 at 0 s is still inside [0, 60]
    assert peak.add(61.0, 0.1) == 0.3
    assert peak.add(121.5, 0.05) == 0.05


def test_arrival_history_counts_whole_seconds_and_stays_bounded() -> None:
    history = ArrivalHistory(capacity_s=4)
    for t in (0.1, 0.5, 0.9, 1.2, 3.7):
        history.add(t)
    assert history.per_second(3.9) == (3.0, 1.0, 0.0)  # 3.x still open
    assert history.per_second(4.0) == (3.0, 1.0, 0.0, 1.0)
    assert history.per_second(100.0) == (0.0, 0.0, 0.0, 0.0)  # only the last 4 kept
