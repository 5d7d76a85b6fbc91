"""Hard limit (median time to first byte, P2 shedding odds) and soft limit (degradation steps)."""

from __future__ import annotations

import random

import pytest

from servepilot.core.config import AdmissionConfig, Priority, ProtectionConfig
from servepilot.routing.admission import (
    AdmissionController,
    AdmissionSnapshot,
    AdmitKind,
    DegradationEvent,
    DegradationLevel,
    HardLimit,
    Reason,
    SoftLimit,
)

NORMAL, SHED_BATCH, CAP_TOKENS = (
    DegradationLevel.NORMAL,
    DegradationLevel.SHED_BATCH,
    DegradationLevel.CAP_TOKENS,
)

# --- hard limit --------------------------------------------------------------------------


def hard(window: int = 8, min_samples: int = 4) -> HardLimit:
    return HardLimit(
        ttfb_threshold_ms=25.0, shed_share=0.05, window=window, min_samples=min_samples
    )


def test_hard_limit_crosses_on_the_window_median_once_there_are_enough_samples() -> None:
    limit = hard()
    for _ in range(3):
        limit.observe("a", 30.0)
    assert not limit.crossed()  # 3 samples < min_samples: a cold replica is not judged yet
    assert limit.median_ms("a") is None
    limit.observe("a", 30.0)
    assert limit.crossed()
    assert limit.current_shed_share() == 0.05


def test_hard_limit_uncrosses_when_fast_samples_push_the_median_down() -> None:
    limit = hard(window=8)
    for _ in range(8):
        limit.observe("a", 30.0)
    for _ in range(3):
        limit.observe("a", 10.0)
    assert limit.median_ms("a") == 30.0  # window: five 30s, three 10s
    assert limit.crossed()
    limit.observe("a", 10.0)
    assert limit.median_ms("a") == 20.0  # four of each: the mean of the middle two
    assert not limit.crossed()
    assert limit.current_shed_share() == 0.0


def test_hard_limit_median_ignores_a_few_spikes_and_needs_strictly_above() -> None:
    limit = hard(window=8)
    for ttfb in (500.0, 400.0, 300.0, 5.0, 5.0, 5.0, 5.0, 5.0):
        limit.observe("spiky", ttfb)
    assert not limit.crossed()
    for _ in range(4):
        limit.observe("at_threshold", 25.0)
    assert limit.median_ms("at_threshold") == 25.0
    assert not limit.crossed()


def test_hard_limit_is_crossed_by_any_one_slow_replica_until_it_is_forgotten() -> None:
    limit = hard()
    for _ in range(4):
        limit.observe("fast1", 5.0)
        limit.observe("fast2", 5.0)
        limit.observe("slow", 40.0)
    assert limit.crossed()
    limit.forget("slow")
    limit.forget("never_seen")
    assert not limit.crossed()


@pytest.mark.parametrize(
    ("kwargs"),
    [
        {"ttfb_threshold_ms": 0.0, "shed_share": 0.05},
        {"ttfb_threshold_ms": 25.0, "shed_share": 1.5},
        {"ttfb_threshold_ms": 25.0, "shed_share": 0.05, "window": 0},
        {"ttfb_threshold_ms": 25.0, "shed_share": 0.05, "window": 4, "min_samples": 5},
    ],
)
def test_invalid_hard_limit_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HardLimit(**kwargs)  # type: ignore[arg-type]


def test_crossed_hard_limit_sheds_about_5_percent_of_p2_and_never_p0_or_p1() -> None:
    protection = ProtectionConfig()  # 25 ms, 5 %
    limit = HardLimit.from_config(protection)
    for _ in range(64):
        limit.observe("r1", 40.0)
    snapshot = AdmissionSnapshot(
        free_slots=10, ready_replicas=1, hard_limit_shed_share=limit.current_shed_share()
    )
    controller = AdmissionController(AdmissionConfig(), protection)
    rng = random.Random(1234)
    draws = 10_000
    decisions = [controller.admit(Priority.P2, snapshot, 0.0, rng) for _ in range(draws)]
    shed = [d for d in decisions if d.kind is AdmitKind.SHED_429]
    # Binomial(10k, 0.05): mean 500, sd ~22; +-100 is beyond 4 sd.
    assert 400 <= len(shed) <= 600
    assert {d.reason for d in shed} == {Reason.HARD_LIMIT}
    for prio in (Priority.P0, Priority.P1):
        kinds = {controller.admit(prio, snapshot, 0.0, rng).kind for _ in range(draws)}
        assert kinds == {AdmitKind.DISPATCH}


# --- soft limit --------------------------------------------------------------------------

SATURATED = {"mean_kv_usage": 0.97, "queued_total": 0, "ready_replicas": 2}
CALM = {"mean_kv_usage": 0.50, "queued_total": 0, "ready_replicas": 2}


def run(
    limit: SoftLimit, start_s: int, end_s: int, state: dict[str, float]
) -> list[DegradationEvent]:
    """One update per second over [start_s, end_s]."""
    events: list[DegradationEvent] = []
    for t in range(start_s, end_s + 1):
        events += limit.update(
            float(t),
            state["mean_kv_usage"],
            int(state["queued_total"]),
            int(state["ready_replicas"]),
        )
    return events


def soft() -> SoftLimit:
    return SoftLimit.from_config(ProtectionConfig())  # 95 % KV, 8 queued/replica, 30 s


def test_sustained_saturation_steps_up_once_per_sustain_period_then_back_down() -> None:
    limit = soft()
    assert run(limit, 0, 29, SATURATED) == []  # 29 s of saturation: no change yet
    assert limit.level is NORMAL
    assert run(limit, 30, 30, SATURATED) == [DegradationEvent(30.0, NORMAL, SHED_BATCH, "kv_usage")]
    assert run(limit, 31, 59, SATURATED) == []
    assert run(limit, 60, 60, SATURATED) == [
        DegradationEvent(60.0, SHED_BATCH, CAP_TOKENS, "kv_usage")
    ]
    assert run(limit, 61, 200, SATURATED) == []  # already at the top step
    assert limit.level is CAP_TOKENS

    assert run(limit, 201, 230, CALM) == []  # calm from 201: 29 s at t=230
    assert run(limit, 231, 231, CALM) == [
        DegradationEvent(231.0, CAP_TOKENS, SHED_BATCH, "recovered")
    ]
    assert run(limit, 232, 261, CALM) == [DegradationEvent(261.0, SHED_BATCH, NORMAL, "recovered")]
    assert run(limit, 262, 400, CALM) == []
    assert limit.level is NORMAL


def test_interrupted_saturation_starts_the_count_again() -> None:
    limit = soft()
    assert run(limit, 0, 20, SATURATED) == []
    assert run(limit, 21, 21, CALM) == []
    assert run(limit, 22, 51, SATURATED) == []
    assert [e.at_s for e in run(limit, 52, 52, SATURATED)] == [52.0]


def test_a_brief_saturation_does_not_stop_recovery_for_long() -> None:
    limit = soft()
    run(limit, 0, 30, SATURATED)
    assert limit.level is SHED_BATCH
    assert run(limit, 31, 50, CALM) == []
    assert run(limit, 51, 51, SATURATED) == []  # the calm count restarts after this
    assert [e.to_level for e in run(limit, 52, 82, CALM)] == [NORMAL]
    assert limit.level is NORMAL


def test_sparse_updates_take_every_step_that_was_due() -> None:
    limit = soft()
    assert limit.update(0.0, 0.99, 0, 1) == []
    events = limit.update(75.0, 0.99, 0, 1)
    assert [(e.at_s, e.to_level) for e in events] == [(30.0, SHED_BATCH), (60.0, CAP_TOKENS)]


@pytest.mark.parametrize(
    ("kv", "queued", "ready", "reason"),
    [
        (0.95, 0, 2, "kv_usage"),  # at the threshold counts
        (0.10, 16, 2, "queue_depth"),  # 8 per replica
        (0.99, 100, 4, "kv_usage,queue_depth"),
        (0.10, 15, 2, None),  # 7.5 per replica
        (0.10, 100, 0, None),  # cold start: queued requests are not load
    ],
)
def test_saturation_criteria(kv: float, queued: int, ready: int, reason: str | None) -> None:
    limit = soft()
    limit.update(0.0, kv, queued, ready)
    events = limit.update(30.0, kv, queued, ready)
    assert [e.reason for e in events] == ([] if reason is None else [reason])
