"""The simulated gateway routes with the gateway's own policy objects: which class decides, and
how requests and prefixes spread over the replicas (answers known in advance)."""

from __future__ import annotations

import itertools

import pytest

from servepilot.core.config import PolicyName
from servepilot.core.errors import ConfigError
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


def test_gateway_pods_each_guess_from_their_share_and_share_the_exact_index() -> None:
    """Three prefixes dealt in turn to two gateway pods: each pod's guess learns each prefix
    on its own first request (6 misses where one gateway has 3), so vLLM recomputes each
    prefix twice; on the exact index, which both pods follow, once, as behind one gateway."""
    from servepilot.sim.fleet.gateways import GatewayPods

    def run(gateways: int, kv_events: bool) -> tuple[FleetSim, float]:
        jobs = [Job(600, 4, prefix_group=g, prefix_tokens=512) for g in range(3)]
        offsets = (i * 0.05 for i in itertools.count())
        spec = fleet_spec(4, policy="prefix_affinity", gateways=gateways, kv_events=kv_events)
        sim, out = run_open(spec, jobs, offsets, 210)
        return sim, out.stats.prefix_hit_rate

    one, one_hit = run(1, False)
    pods, pods_hit = run(2, False)
    assert type(pods.policy) is GatewayPods and type(one.policy) is PrefixAffinity
    # 9 blocks of 256 characters a request, the first 8 inside the prefix.
    assert one.policy.stats()["prefix_blocks_matched"] == 8 * (210 - 3)
    assert pods.policy.stats()["prefix_blocks_matched"] == 8 * (210 - 6)
    assert pods.policy.stats()["prefix_blocks_total"] == 9 * 210  # the pods' added up
    # vLLM's hits: 512 of 600 prompt tokens, but for each prefix's misses.
    assert one_hit == pytest.approx(512 / 600 * (210 - 3) / 210, rel=1e-9)
    assert pods_hit == pytest.approx(512 / 600 * (210 - 6) / 210, rel=1e-9)
    exact, exact_hit = run(2, True)
    assert exact_hit == pytest.approx(one_hit, rel=1e-9)
    assert exact.policy.stats()["exact_routed"] == 210


def test_one_gateway_pod_is_the_policy_itself() -> None:
    with pytest.raises(ConfigError, match="gateways must be at least 1"):
        fleet_spec(2, gateways=0)
    assert type(FleetSim(fleet_spec(2, policy="least_load", gateways=1)).policy) is LeastLoad
