"""The autoscalers' failure modes users report of the anchors' (issue 37), ruled out on the
simulated fleet for every policy of `scaling/`: replicas starting count as capacity on their
way (no cascade of scale-ups during a cold start), no oscillation on a flat noisy load, and
down to the minimum when idle.

The fleet: replicas of 16 sequences and a gateway budget of 8, one serving about 6 req/s
of 200-token prompts and 20-token answers within the SLO (TTFT 1 s, TPOT 50 ms), between 1
and 10 replicas, a decision every 5 s, a 60 s cold start; Poisson arrivals, seeded."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from servepilot.core.config import ScalingPolicyName
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import parse_slo
from servepilot.load.loadplan import LoadPlan
from servepilot.plan.costmodel import CostModel
from servepilot.scaling.oracle import OracleSetup
from servepilot.scaling.policies import AutoscaleSetup
from servepilot.scaling.snapshot import AutoscalePolicy
from servepilot.sim import SchedulerConfig
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec
from servepilot.sim.fleet.traffic import Job, JobTable

COST = CostModel(0.01, 1e-4, 1e-3, 2e-3, 1e-6, 0.0, source="test")
COLD_S, TICK_S, REPLICA_RPS = 60.0, 5.0, 6.0
POLICIES = ("target", "step", "predictive", "oracle")
N_S = 600.0
"""At most one direction change per N = 10 minutes on a flat load."""


def _sends(rate: Callable[[float], float], duration_s: float, seed: int = 1) -> list[float]:
    """Poisson arrivals at `rate(t)` (thinned from 40 req/s)."""
    rng, t, out = random.Random(seed), 0.0, []
    while t < duration_s:
        t += rng.expovariate(40.0)
        if rng.random() < rate(t) / 40.0:
            out.append(t)
    return out


def _policy(name: str, sends: list[float]) -> AutoscalePolicy:
    if name == "oracle":
        return OracleSetup(1, 10, REPLICA_RPS, COLD_S + TICK_S).build(sends)
    setup = AutoscaleSetup(ScalingPolicyName(name), 1, 10, replica_rps=REPLICA_RPS,
                           horizon_s=COLD_S + TICK_S)  # fmt: skip
    return setup.build()


def _run(name: str, sends: list[float], start: int) -> list[tuple[float, int, int]]:
    """The scale events (when, from, to) of `name` on a fleet of `start` ready replicas."""
    scheduler = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048,
                                max_model_len=2048, block_size=16, num_blocks=4000)  # fmt: skip
    spec = FleetSpec(scheduler, COST, start, 8, network=NetworkConfig(cross_node=Delay()),
                     scrape_interval_s=1.0, cold_start_s=COLD_S,
                     autoscale_interval_s=TICK_S)  # fmt: skip
    sim = FleetSim(spec, autoscaler=_policy(name, sends))
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=1.0), duration_s=sends[-1], grace_s=10.0)
    slo = parse_slo("ttft_p99_ms=1000,tpot_p99_ms=50")
    sim.run(plan, JobTable([Job(200, 20)]), slo, offsets=iter(sends))
    assert sim.autoscale is not None
    return [(e.at_s, e.before, e.decision.replicas) for e in sim.autoscale.events]


@pytest.mark.parametrize(
    ("name", "step_at_s"),
    [*((name, 0.0) for name in POLICIES), ("target", 120.0), ("step", 120.0)],
)
def test_no_scale_up_is_asked_while_the_last_one_is_still_starting(
    name: str, step_at_s: float
) -> None:
    # 24 req/s (4-5 replicas needed) from the start on one replica, or from 2 minutes of 6
    # req/s on two: a policy that reads the queue growing during a cold start as more load
    # (the capacity asked for is not serving yet) asks again every tick of it (target did:
    # 3, 6, 7, 8, 9, 10 in 30 s; now 3, 4, 5 as the arrivals' mean climbs to the step).
    # predictive and the oracle size from the arrival rate, which a pending replica does not
    # change; on the step they ask again as their forecast (or the oracle's 30 s window)
    # climbs to it (predictive's trend overshoots: 4, 7, 9, 10), which is not this failure.
    events = _run(name, _sends(lambda t: 24.0 if t >= step_at_s else 6.0, 420.0),
                  start=1 if step_at_s == 0 else 2)  # fmt: skip
    # Once the arrivals' 15 s mean has reached the step (a tick later), nothing more is asked
    # until the first replica asked for is up.
    settled_s = step_at_s + 15.0 + TICK_S
    ups = [at_s for at_s, before, after in events if after > before]
    assert ups, "the load needs more than one replica"
    late = [t for t in ups if settled_s <= t < ups[0] + COLD_S]
    assert not late, events


@pytest.mark.parametrize("name", POLICIES)
def test_a_flat_noisy_load_changes_direction_at_most_once_per_ten_minutes(name: str) -> None:
    # 15 req/s for 40 minutes on the 4 replicas it needs. The first N minutes are the policies'
    # learning (utilisation is steeper than linear near capacity: a count found too few is
    # remembered, `scaling.flap`); after them, at most one change of direction per N.
    events = _run(name, _sends(lambda t: 15.0, 2400.0), start=4)
    turns, direction = [], 0
    for at_s, before, after in events:
        step = 1 if after > before else -1
        if direction and step != direction:
            turns.append(at_s)
        direction = step
    late = [t for t in turns if t >= N_S]
    assert all(b - a >= N_S for a, b in itertools.pairwise(late)), events
    assert len(late) <= 2400.0 / N_S - 1, events


@pytest.mark.parametrize("name", POLICIES)
def test_an_idle_fleet_goes_down_to_the_minimum(name: str) -> None:
    # 20 req/s for 5 minutes, then a request every 50 s for 20 minutes.
    events = _run(name, _sends(lambda t: 20.0 if t < 300.0 else 0.02, 1500.0), start=1)
    assert events and max(after for _, _, after in events) > 1
    assert events[-1][2] == 1, events
