"""Circuit breakers: the full state cycle, the single half-open probe, the per-replica board."""

from __future__ import annotations

import pytest

from servepilot.core.config import ProtectionConfig
from servepilot.routing.admission import (
    BreakerBoard,
    BreakerState,
    BreakerTransition,
    CircuitBreaker,
)

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def opened_at(t_s: float, failures: int = 3, open_s: float = 10.0) -> CircuitBreaker:
    breaker = CircuitBreaker(failures_to_open=failures, open_s=open_s, name="r1")
    for _ in range(failures):
        breaker.record_failure(t_s)
    assert breaker.state is OPEN
    breaker.drain_events()
    return breaker


def test_full_cycle_closed_open_half_open_closed() -> None:
    breaker = CircuitBreaker(failures_to_open=3, open_s=10.0, name="r1")
    breaker.record_failure(1.0)
    breaker.record_failure(2.0)
    breaker.record_success(3.0)  # failures must be consecutive: this resets the count
    assert breaker.consecutive_failures == 0
    for t in (3.0, 4.0):
        breaker.record_failure(t)
    assert breaker.state is CLOSED
    assert breaker.allow(4.5)
    breaker.record_failure(5.0)
    assert breaker.state is OPEN

    assert not breaker.allow(14.9)
    assert breaker.would_allow(15.0)
    assert breaker.state is OPEN  # would_allow does not claim the probe
    assert breaker.allow(15.0)  # the probe
    assert breaker.state is HALF_OPEN
    breaker.record_success(16.0)
    assert breaker.state is CLOSED
    assert all(breaker.allow(16.5) for _ in range(5))

    assert breaker.drain_events() == [
        BreakerTransition("r1", 5.0, CLOSED, OPEN),
        BreakerTransition("r1", 15.0, OPEN, HALF_OPEN),
        BreakerTransition("r1", 16.0, HALF_OPEN, CLOSED),
    ]
    assert breaker.drain_events() == []
    assert breaker.transitions == 3


def test_only_one_probe_is_in_flight_while_half_open() -> None:
    breaker = opened_at(0.0)
    assert breaker.allow(10.0)
    assert [breaker.allow(t) for t in (10.0, 11.0, 50.0)] == [False, False, False]
    assert not breaker.would_allow(50.0)


def test_failed_probe_reopens_for_another_open_period() -> None:
    breaker = opened_at(0.0)
    assert breaker.allow(10.0)
    breaker.record_failure(12.0)
    assert breaker.state is OPEN
    assert not breaker.allow(21.9)  # open_s counts from the failed probe, not the first open
    assert breaker.allow(22.0)
    assert breaker.state is HALF_OPEN
    assert [(e.from_state, e.to_state) for e in breaker.drain_events()] == [
        (OPEN, HALF_OPEN),
        (HALF_OPEN, OPEN),
        (OPEN, HALF_OPEN),
    ]


def test_outcomes_reported_while_open_change_nothing() -> None:
    breaker = opened_at(0.0)
    breaker.record_success(1.0)  # a request sent before it opened
    assert breaker.state is OPEN
    breaker.record_failure(9.0)  # must not push the half-open probe back
    assert breaker.allow(10.0)


def test_abandoned_probe_frees_the_slot_for_another_probe() -> None:
    breaker = opened_at(0.0)
    assert breaker.allow(10.0)
    breaker.record_abandoned(11.0)
    assert breaker.state is HALF_OPEN
    assert breaker.allow(11.0)
    assert not breaker.allow(11.0)


def test_abandoned_request_while_closed_is_a_no_op() -> None:
    breaker = CircuitBreaker(failures_to_open=1, open_s=1.0)
    breaker.record_abandoned(0.0)
    assert breaker.state is CLOSED
    assert breaker.transitions == 0


def test_single_failure_threshold_opens_at_once() -> None:
    breaker = CircuitBreaker(failures_to_open=1, open_s=1.0)
    breaker.record_failure(0.0)
    assert breaker.state is OPEN


@pytest.mark.parametrize(("failures", "open_s"), [(0, 1.0), (1, 0.0), (1, -1.0)])
def test_invalid_breaker_settings_are_refused(failures: int, open_s: float) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(failures, open_s)
    with pytest.raises(ValueError):
        BreakerBoard(failures, open_s)


def test_board_keeps_one_breaker_per_replica_created_on_demand() -> None:
    board = BreakerBoard.from_config(ProtectionConfig(breaker_failures=2, breaker_open_s=5.0))
    assert board.would_allow("a", 0.0)  # unknown replica: nothing against it
    assert board.states() == {}
    for _ in range(2):
        board.record_failure("a", 1.0)
    board.record_success("b", 1.0)
    assert board.states() == {"a": OPEN, "b": CLOSED}
    assert not board.allow("a", 2.0)
    assert board.allow("b", 2.0)
    assert board.get("a") is board.get("a")
    assert board.allow("a", 6.0)
    board.record_abandoned("a", 6.5)
    board.record_abandoned("unknown", 6.5)  # no breaker is created for it
    assert "unknown" not in board.states()
    assert board.drain_events() == [
        BreakerTransition("a", 1.0, CLOSED, OPEN),
        BreakerTransition("a", 6.0, OPEN, HALF_OPEN),
    ]


def test_board_forgets_a_removed_replica() -> None:
    board = BreakerBoard(failures_to_open=1, open_s=60.0)
    board.record_failure("gone", 0.0)
    assert not board.would_allow("gone", 1.0)
    board.forget("gone")
    board.forget("never_seen")
    assert board.states() == {}
    assert board.allow("gone", 1.0)  # a replica re-added under the same id starts closed


def test_events_kept_are_bounded_but_counted() -> None:
    breaker = CircuitBreaker(failures_to_open=1, open_s=1.0)
    for i in range(200):  # each round: closed -> open -> half_open -> closed
        t = i * 10.0
        breaker.record_failure(t)
        assert breaker.allow(t + 1.0)
        breaker.record_success(t + 1.0)
    assert breaker.transitions == 600
    events = breaker.drain_events()
    assert len(events) == 256
    assert events[-1] == BreakerTransition("", 1991.0, HALF_OPEN, CLOSED)
