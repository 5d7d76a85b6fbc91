"""The batch AIMD window, with known answers."""

from __future__ import annotations

import pytest

from servepilot.gateway.batch.aimd import AimdWindow


def test_slow_start_grows_by_one_per_success_up_to_the_ceiling() -> None:
    window = AimdWindow(ceiling=8)
    assert window.limit == 1
    for _ in range(5):
        window.on_success()
    assert window.limit == 6
    for _ in range(10):
        window.on_success()
    assert window.limit == 8


def test_pushback_halves_once_per_window_then_grows_one_per_window() -> None:
    window = AimdWindow(ceiling=64, start=20)
    assert window.on_pushback() and window.limit == 10
    # The 20 lines sent under the old window may all come back refused: one cut only.
    assert not any(window.on_pushback() for _ in range(20))
    assert window.limit == 10
    assert window.on_pushback() and window.limit == 5
    for _ in range(4):
        window.on_success()
    assert window.limit == 5  # not a whole window of successes yet
    window.on_success()
    assert window.limit == 6
    for _ in range(6):
        window.on_success()
    assert window.limit == 7


def test_the_floor_holds() -> None:
    window = AimdWindow(ceiling=4, floor=2, start=4)
    window.on_pushback()
    for _ in range(4):
        window.on_pushback()
    window.on_pushback()
    assert window.limit == 2


def test_a_growing_interactive_queue_cuts_the_window() -> None:
    window = AimdWindow(ceiling=64, start=16)
    assert not window.on_interactive_queue(0)
    assert window.on_interactive_queue(3) and window.limit == 8
    assert not window.on_interactive_queue(3)  # steady: no new push-back
    assert not window.on_interactive_queue(1)  # draining


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="floor <= ceiling"):
        AimdWindow(ceiling=2, floor=3)
