"""A step's tokens, streamed one request after another, read back from their arrivals."""

from __future__ import annotations

import pytest

from servepilot.bench.token_spread import step_spreads_s


def _stream(index: int, steps: range) -> list[float]:
    """A request's arrivals: 20 ms steps, each step's tokens streamed 50 us apart, the order
    of the requests turning each step."""
    return [0.020 * k + 50e-6 * ((index + k) % 4) for k in steps]


def test_each_full_step_reads_the_time_between_its_tokens() -> None:
    """Four streams, two of them from step 2 on, and step 10's tokens held back until step
    11's (eight together): every full step reads 50 us; the ramp (steps 0 and 1, two tokens
    each) and the double step are left out."""
    streams = [_stream(i, range(30)) for i in (0, 1)] + [_stream(i, range(2, 30)) for i in (2, 3)]
    for times in streams:
        times[10 - (30 - len(times))] += 0.020 - 300e-6
    spreads = step_spreads_s(streams)
    assert len(spreads) == 26
    assert spreads == pytest.approx([50e-6] * 26, abs=1e-12)


def test_streams_without_two_tokens_read_nothing() -> None:
    assert step_spreads_s([]) == []
    assert step_spreads_s([[0.1], [0.2]]) == []
