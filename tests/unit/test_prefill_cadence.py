"""A busy engine's full prefill steps, read back from when its first tokens arrived."""

from __future__ import annotations

import pytest

from servepilot.bench.prefill_cadence import FullStep, full_steps

PREFILL_S = 0.100
DECODE_S = 0.020


def _burst(groups: list[int], answer_tokens: int = 6) -> list[tuple[float, list[float]]]:
    """Requests all sent at 0; step k finishes `groups[k]` prompts and ends at 0.1 s x (k+1),
    every earlier request taking one token from each step; after the prefills, decode steps
    of 20 ms. Each step's tokens reach their clients 50 us apart."""
    prefill_ends = [PREFILL_S * (k + 1) for k in range(len(groups))]
    step_ends = prefill_ends + [prefill_ends[-1] + DECODE_S * (j + 1) for j in range(answer_tokens)]
    requests = []
    for k, count in enumerate(groups):
        for _ in range(count):
            offset = 50e-6 * len(requests)
            requests.append((0.0, [end + offset for end in step_ends[k : k + answer_tokens]]))
    return requests


def test_the_time_between_full_groups_of_first_tokens_is_a_full_step() -> None:
    """Groups of 1, 4, 4, 4 and 3 prompts: the first group waited for the API server (1
    prompt: not full), the last left no prompt waiting; the two steps between full groups
    with prompts left over read 100 ms each, with the decoders of the step before."""
    steps = full_steps(_burst([1, 4, 4, 4, 3]))
    assert [s.prompts for s in steps] == [4, 4]
    assert [s.period_s for s in steps] == pytest.approx([PREFILL_S, PREFILL_S], abs=1e-3)
    assert [s.decoders for s in steps] == [5, 9]
    assert all(isinstance(s, FullStep) for s in steps)


def test_a_step_that_emptied_the_queue_is_not_full() -> None:
    """Two groups of four, the second the last prompts: nothing waits after it."""
    assert full_steps(_burst([4, 4])) == []


def test_requests_without_tokens_read_nothing() -> None:
    assert full_steps([]) == []
    assert full_steps([(0.0, [0.1]), (0.0, [])]) == []
