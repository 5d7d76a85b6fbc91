"""Routing policies: known answers for round robin and power-of-two least load."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from servepilot.core.config import PolicyName, RoutingConfig
from servepilot.routing import (
    Hybrid,
    LeastLoad,
    LengthShard,
    PrefixAffinity,
    RoundRobin,
    SessionAffinity,
    make_policy,
)
from servepilot.routing.base import ReplicaView, RequestView

REQUEST = RequestView(model="m")


def views(*ids: str) -> list[ReplicaView]:
    return [ReplicaView(replica_id=rid, in_flight=0) for rid in ids]


def test_round_robin_cycles_over_three_replicas_in_id_order() -> None:
    policy = RoundRobin()
    candidates = views("b", "c", "a")
    picks = [policy.choose(REQUEST, candidates) for _ in range(7)]
    assert picks == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_keeps_turns_when_a_replica_is_removed() -> None:
    policy = RoundRobin()
    assert [policy.choose(REQUEST, views("a", "b", "c")) for _ in range(2)] == ["a", "b"]
    # "b" (the last chosen) leaves: the turn passes to the next one, not back to the start.
    remaining = views("a", "c")
    assert [policy.choose(REQUEST, remaining) for _ in range(4)] == ["c", "a", "c", "a"]


def test_round_robin_slots_in_a_new_replica() -> None:
    policy = RoundRobin()
    assert policy.choose(REQUEST, views("a", "c")) == "a"
    assert [policy.choose(REQUEST, views("a", "b", "c")) for _ in range(3)] == ["b", "c", "a"]


def test_round_robin_single_candidate() -> None:
    policy = RoundRobin()
    assert [policy.choose(REQUEST, views("only")) for _ in range(3)] == ["only"] * 3


def test_least_load_with_two_candidates_always_picks_the_lower_load() -> None:
    policy = LeastLoad(random.Random(0))
    candidates = [
        ReplicaView("busy", in_flight=3, num_requests_waiting=2),
        ReplicaView("idle", in_flight=1, num_requests_waiting=0),
    ]
    assert {policy.choose(REQUEST, candidates) for _ in range(50)} == {"idle"}


def test_least_load_counts_queued_requests_as_load() -> None:
    policy = LeastLoad(random.Random(0))
    candidates = [
        ReplicaView("queued", in_flight=0, num_requests_waiting=5),
        ReplicaView("running", in_flight=2, num_requests_running=2),
    ]
    assert policy.choose(REQUEST, candidates) == "running"


def test_least_load_breaks_ties_by_kv_cache_then_in_flight() -> None:
    policy = LeastLoad(random.Random(0))
    by_kv = [
        ReplicaView("full", in_flight=1, num_requests_waiting=1, kv_cache_usage=0.9),
        ReplicaView("roomy", in_flight=1, num_requests_waiting=1, kv_cache_usage=0.2),
    ]
    assert {policy.choose(REQUEST, by_kv) for _ in range(20)} == {"roomy"}
    # Same load (in_flight + waiting = 2) and KV use: fewer requests of our own wins.
    by_in_flight = [
        ReplicaView("ours", in_flight=2, num_requests_waiting=0),
        ReplicaView("queued", in_flight=0, num_requests_waiting=2),
    ]
    assert {policy.choose(REQUEST, by_in_flight) for _ in range(20)} == {"queued"}


def test_least_load_full_tie_is_split_between_both() -> None:
    policy = LeastLoad(random.Random(7))
    picks = Counter(policy.choose(REQUEST, views("a", "b")) for _ in range(2000))
    assert 900 < picks["a"] < 1100


def test_least_load_never_picks_the_most_loaded_of_many() -> None:
    policy = LeastLoad(random.Random(42))
    candidates = [ReplicaView(f"r{i}", in_flight=i) for i in range(5)]
    picks = Counter(policy.choose(REQUEST, candidates) for _ in range(10_000))
    assert picks["r4"] == 0
    # Power of two choices: r_i wins when it is sampled with a higher-loaded one, i.e. with
    # probability (4 - i) / C(5, 2) = (4 - i) / 10.
    for i, expected in enumerate([0.4, 0.3, 0.2, 0.1]):
        assert picks[f"r{i}"] / 10_000 == pytest.approx(expected, abs=0.02)


def test_least_load_is_reproducible_with_a_seed() -> None:
    candidates = views("a", "b", "c", "d")

    def run(seed: int) -> list[str]:
        policy = LeastLoad(random.Random(seed))
        return [policy.choose(REQUEST, candidates) for _ in range(30)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_make_policy_builds_each_named_policy() -> None:
    assert isinstance(make_policy(PolicyName.ROUND_ROBIN), RoundRobin)
    least = make_policy(PolicyName.LEAST_LOAD, seed=1)
    assert isinstance(least, LeastLoad)
    assert least.name == "least_load"
    assert make_policy(PolicyName("round_robin")).name == "round_robin"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (PolicyName.ROUND_ROBIN, RoundRobin),
        (PolicyName.LEAST_LOAD, LeastLoad),
        (PolicyName.PREFIX_AFFINITY, PrefixAffinity),
        (PolicyName.SESSION, SessionAffinity),
        (PolicyName.LENGTH_SHARD, LengthShard),
        (PolicyName.HYBRID, Hybrid),
    ],
)
def test_make_policy_builds_every_policy_with_its_config(name: PolicyName, kind: type) -> None:
    policy = make_policy(name, RoutingConfig(), seed=3)
    assert type(policy) is kind
    assert policy.name == name.value
    assert policy.uses_prefix is (name in {PolicyName.PREFIX_AFFINITY, PolicyName.HYBRID})
    assert make_policy(PolicyName(name.value)).name == name.value  # default config
    candidates = views("a", "b", "c")
    assert policy.choose(REQUEST, candidates) in {"a", "b", "c"}
    assert all(isinstance(value, float) for value in policy.stats().values())
    policy.forget("a")


def test_make_policy_passes_the_config_and_seed_on() -> None:
    config = RoutingConfig(session_ttl_s=5.0)
    policy = make_policy(PolicyName.SESSION, config, 7)
    candidates = views("a", "b", "c", "d")
    policy.choose(RequestView(model="m", session_id="s", arrival_s=0.0), candidates)
    policy.choose(RequestView(model="m", session_id="s", arrival_s=6.0), candidates)
    assert policy.stats()["session_misses"] == 2  # expired after the configured 5 s

    def picks(seed: int) -> list[str]:
        seeded = make_policy(PolicyName.HYBRID, seed=seed)
        return [seeded.choose(REQUEST, candidates) for _ in range(30)]

    assert picks(1) == picks(1)
    assert picks(1) != picks(2)


def test_make_policy_refuses_an_unknown_name() -> None:
    with pytest.raises(ValueError):
        make_policy("nearest")  # type: ignore[arg-type]
