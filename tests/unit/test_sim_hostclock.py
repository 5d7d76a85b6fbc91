"""HostClock: vLLM's launches and token hand-outs with async scheduling, by known answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servepilot.sim.engine.hostclock import HostClock
from servepilot.sim.engine.records import StepResult
from tests.unit.sim_replica_support import COST

COST_EAGER = replace(COST, eager_floor_s=0.05, eager_mixed_floor_s=0.08, graph_max_tokens=512)


def _step(prefill_tokens: int, decode_seqs: int) -> StepResult:
    return StepResult(0.0, 0.01, prefill_tokens, 1 if prefill_tokens else 0, decode_seqs, 0, 0,
                      decode_seqs, 0.01, (), (), (), ())  # fmt: skip


def test_an_eager_launch_overlaps_the_step_before_and_holds_its_tokens() -> None:
    host = HostClock(COST_EAGER, async_scheduling=True)
    host.launched(_step(100, 0), 0.0)  # from idle: a graph, launched at once
    assert host.lead_s(0.010) == pytest.approx(0.010)  # the next one launched at 0 as well
    host.launched(_step(0, 1), 0.0)
    assert host.emitted(0.010, True) == (0.010, 0.010)  # step 1's tokens at its end
    # Step 3 (a prefill beside the decoder: the mixed floor) launches once step 1's tokens
    # are out, at 10 ms, while step 2 runs to 20 ms: its tokens wait to 90 ms.
    assert host.lead_s(0.020) == pytest.approx(0.010)
    host.launched(_step(1000, 1), 0.010)
    out_s, gap_s = host.emitted(0.020, True)
    assert (out_s, gap_s) == (pytest.approx(0.090), pytest.approx(0.080))
    # Step 3 ended at 90 ms (its launch); the next, a graph, launches then: its tokens at once.
    assert host.lead_s(0.090) == pytest.approx(0.0)
    host.launched(_step(0, 2), 0.090)
    assert host.emitted(0.090, True) == (pytest.approx(0.090), pytest.approx(0.0))
    # The last step: nothing to launch after it, its tokens at its end.
    assert host.emitted(0.100, False) == (pytest.approx(0.100), pytest.approx(0.010))


def test_without_async_scheduling_tokens_leave_at_each_steps_end() -> None:
    host = HostClock(COST_EAGER, async_scheduling=False)
    assert host.lead_s(0.5) == 0.0
    host.launched(_step(1000, 0), 0.5)  # a prefill alone: the plain floor
    assert host.launch_end_s == pytest.approx(0.55)
    assert host.emitted(0.55, True) == (pytest.approx(0.55), pytest.approx(0.55))


def test_the_host_schedules_between_eager_launches_by_the_sequences() -> None:
    """An eager step's launch holds the host for the floor and its work beside it: 4 ms and
    25 us for each sequence the step carries (a prompt and 3 decoders here)."""
    cost = replace(COST_EAGER, eager_host_s=0.004, eager_host_per_seq_s=25e-6)
    host = HostClock(cost, async_scheduling=True)
    host.launched(_step(1000, 3), 0.010)
    assert host.launch_end_s == pytest.approx(0.010 + 0.080 + 0.004 + 4 * 25e-6)
    host.launched(_step(0, 3), 0.2)  # a graph: launched at once
    assert host.launch_end_s == 0.2
