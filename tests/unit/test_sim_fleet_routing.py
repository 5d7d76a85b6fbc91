"""The simulated gateway routes with the gateway's own policy objects: which class decides, and
how requests and prefixes spread over the replicas (answers known in advance)."""

from __future__ import annotations

import itertools

import pytest

from servepilot.core.config import PolicyName
from servepilot.routing import LeastLoad, PrefixAffinity, RoundRobin, make_policy
from servepilot.routing.admission import (
    AdmissionController,
    AdmissionQueue,
)
from servepilot.sim.fleet.simulator import FleetSim
from servepilot.sim.fleet.traffic import Job
from tests.unit.sim_fleet_support import (
    fleet_spec,
    run_open,
)


def test_the_policy_and_admission_are_the_gateways_classes() -> None:
    for name, cls in [("round_robin", RoundRobin), ("least_load", LeastLoad),
                      ("prefix_affinity", PrefixAffinity)]:  # fmt: skip
        sim = FleetSim(fleet_spec(2, policy=name))
        assert type(sim.policy) is cls
        assert type(sim.policy) is type(make_policy(PolicyName(name)))
    assert isinstance(sim.gateway.controller, AdmissionController)
    assert isinstance(sim.gateway.queue, AdmissionQueue)


def test_round_robin_spreads_requests_exactly_evenly() -> None:
    sim, out = run_open(fleet_spec(4), [Job(50, 3)], (i * 0.01 for i in itertools.count()), 400)
    assert [r.dispatched for r in sim.replicas] == [100, 100, 100, 100]
    assert out.run.completed == 400


def test_prefix_affinity_keeps_a_prefix_on_one_replica_and_hits_its_cache() -> None:
    jobs = [Job(600, 4, prefix_group=g, prefix_tokens=512) for g in range(2)]
    offsets = (i * 0.05 for i in itertools.count())
    sim, out = run_open(fleet_spec(4, policy="prefix_affinity"), jobs, offsets, 200)
    used = [r for r in sim.replicas if r.dispatched]
    assert 1 <= len(used) <= 2  # one replica per prefix (two prefixes may share one)
    # After each prefix's first request, 512 of 600 prompt tokens come from the cache.
    assert out.stats.prefix_hit_rate == pytest.approx(512 / 600 * 198 / 200, rel=1e-9)
    # The gateway hashes 600 x 4 characters in 256-character blocks: 9 blocks, the first 8
    # inside the prefix; every request but each prefix's first matches those 8.
    stats = sim.policy.stats()
    assert stats["prefix_blocks_total"] == 9 * 200
    assert stats["prefix_blocks_matched"] == 8 * 198


def test_round_robin_scatters_the_same_prefixes() -> None:
    jobs = [Job(600, 4, prefix_group=g, prefix_tokens=512) for g in range(2)]
    offsets = (i * 0.05 for i in itertools.count())
    sim, out = run_open(fleet_spec(4), jobs, offsets, 200)
    assert all(r.dispatched == 50 for r in sim.replicas)
    # Each replica misses each prefix once (4 x 2 misses instead of 2).
    assert out.stats.prefix_hit_rate < 512 / 600 * 198 / 200
