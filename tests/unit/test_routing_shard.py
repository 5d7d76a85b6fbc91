"""Length sharding (groups, phase 1, dynamic compensation) and the hybrid default policy."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest

from servepilot.core.config import RoutingConfig
from servepilot.routing import Hybrid, LengthShard
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.length_shard import LONG, SHORT, compensation_share
from servepilot.routing.prefix import prefix_hashes

CONFIG = RoutingConfig(long_group_share=0.5, compensation_max_share=0.10)
SHORT_PROMPT = RequestView(model="m", prompt_tokens=300)
LONG_PROMPT = RequestView(model="m", prompt_tokens=9000)
IDS = ("r0", "r1", "r2", "r3")


def views(ids: tuple[str, ...] = IDS, loads: dict[str, int] | None = None) -> list[ReplicaView]:
    loads = loads or {}
    return [ReplicaView(rid, in_flight=loads.get(rid, 0), capacity=100) for rid in ids]


def groups(policy: LengthShard, ids: tuple[str, ...] = IDS) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for rid in ids:
        group = policy.group_of(rid)
        assert group is not None
        found[group].add(rid)
    return dict(found)


def test_four_replicas_split_two_and_two() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    policy.choose(SHORT_PROMPT, views())
    split = groups(policy)
    assert len(split[SHORT]) == 2 and len(split[LONG]) == 2


def test_groups_are_stable_when_candidates_fluctuate() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    # Replicas first show up two at a time, in an arbitrary order.
    policy.choose(SHORT_PROMPT, views(("r3", "r2")))
    policy.choose(SHORT_PROMPT, views(("r1", "r0", "r2")))
    before = groups(policy)
    assert len(before[SHORT]) == 2 and len(before[LONG]) == 2
    rng = random.Random(5)
    for _ in range(200):
        subset = tuple(rid for rid in IDS if rng.random() < 0.6) or ("r0",)
        policy.choose(LONG_PROMPT if rng.random() < 0.5 else SHORT_PROMPT, views(subset))
    assert groups(policy) == before


@pytest.mark.parametrize(
    ("replicas", "long_share", "expected_long"),
    [(2, 0.5, 1), (3, 0.5, 2), (5, 0.2, 1), (5, 0.5, 2), (4, 0.9, 3), (10, 0.3, 3)],
)
def test_group_sizes_follow_the_long_share(
    replicas: int, long_share: float, expected_long: int
) -> None:
    policy = LengthShard(RoutingConfig(long_group_share=long_share), random.Random(0))
    ids = tuple(f"r{i}" for i in range(replicas))
    policy.choose(SHORT_PROMPT, views(ids))
    split = groups(policy, ids)
    assert len(split.get(LONG, set())) == expected_long
    assert len(split.get(SHORT, set())) == replicas - expected_long


def prime(policy: LengthShard) -> None:
    """Route one long and one short prompt, so that neither group lends its replicas to the
    other (each would, having seen no prompt of its own yet)."""
    policy.choose(LONG_PROMPT, views())
    policy.choose(SHORT_PROMPT, views())


def test_short_prompts_never_go_to_the_long_group_when_loads_are_equal() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    prime(policy)
    candidates = views()
    picks = Counter(policy.choose(SHORT_PROMPT, candidates) for _ in range(500))
    long_ids = groups(policy)[LONG]
    assert not set(picks) & long_ids
    assert len(picks) == 2  # least load spreads within the short group
    long_picks = {policy.choose(LONG_PROMPT, candidates) for _ in range(100)}
    assert long_picks == long_ids
    stats = policy.stats()
    assert (stats["shard_short"], stats["shard_long"], stats["shard_compensated"]) == (501, 101, 0)
    assert stats["shard_lent"] == 1  # the priming long prompt, before any short one


def test_an_idle_long_group_lends_its_replicas_to_short_prompts() -> None:
    config = RoutingConfig(long_group_share=0.5, group_idle_s=60.0)
    policy = LengthShard(config, random.Random(0))
    candidates = views()

    def short_at(t: float) -> str:
        return policy.choose(RequestView(model="m", prompt_tokens=300, arrival_s=t), candidates)

    # No long prompt yet: short ones use all four replicas.
    assert {short_at(0.0) for _ in range(200)} == set(IDS)
    policy.choose(RequestView(model="m", prompt_tokens=9000, arrival_s=10.0), candidates)
    long_ids = groups(policy)[LONG]
    # A long prompt arrived: the long group is its own again (equal loads: no compensation).
    assert not {short_at(30.0) for _ in range(200)} & long_ids
    # 60 s without a long prompt: lent again.
    assert {short_at(70.1) for _ in range(200)} == set(IDS)
    assert policy.stats()["shard_lent"] == 400


def test_prompt_tokens_are_estimated_from_characters_when_missing() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    candidates = views()
    long_ids = groups_after_first(policy)[LONG]
    # 4 characters per token: 32768 characters are 8192 tokens, the boundary.
    assert policy.choose(RequestView(model="m", prompt_chars=32_768), candidates) in long_ids
    assert policy.choose(RequestView(model="m", prompt_chars=32_767), candidates) not in long_ids
    explicit = RequestView(model="m", prompt_chars=100_000, prompt_tokens=10)
    assert policy.choose(explicit, candidates) not in long_ids


def groups_after_first(policy: LengthShard) -> dict[str, set[str]]:
    prime(policy)
    return groups(policy)


def test_compensation_moves_about_the_max_share_from_a_loaded_short_group() -> None:
    policy = LengthShard(CONFIG, random.Random(11))
    split = groups_after_first(policy)
    loads = {rid: 90 for rid in split[SHORT]}  # short at 0.9 utilisation, long idle
    candidates = views(loads=loads)
    requests = 20_000
    picks = Counter(policy.choose(SHORT_PROMPT, candidates) for _ in range(requests))
    moved = sum(picks[rid] for rid in split[LONG]) / requests
    assert moved == pytest.approx(0.10, abs=0.01)
    assert policy.stats()["shard_compensated"] == sum(picks[rid] for rid in split[LONG])


def test_compensation_works_both_ways() -> None:
    policy = LengthShard(CONFIG, random.Random(12))
    split = groups_after_first(policy)
    candidates = views(loads={rid: 80 for rid in split[LONG]})
    picks = Counter(policy.choose(LONG_PROMPT, candidates) for _ in range(20_000))
    moved = sum(picks[rid] for rid in split[SHORT]) / 20_000
    assert moved == pytest.approx(0.10, abs=0.01)


def test_a_small_imbalance_moves_a_small_share() -> None:
    policy = LengthShard(CONFIG, random.Random(13))
    split = groups_after_first(policy)
    # Short at 0.04 utilisation, long idle: 4% of short requests move.
    candidates = views(loads={rid: 4 for rid in split[SHORT]})
    picks = Counter(policy.choose(SHORT_PROMPT, candidates) for _ in range(20_000))
    moved = sum(picks[rid] for rid in split[LONG]) / 20_000
    assert moved == pytest.approx(0.04, abs=0.008)


@pytest.mark.parametrize(
    ("home", "other", "max_share", "expected"),
    [
        (0.9, 0.0, 0.10, 0.10),
        (0.05, 0.0, 0.10, 0.05),
        (0.3, 0.3, 0.10, 0.0),
        (0.1, 0.8, 0.10, 0.0),
        (5.0, 0.0, 0.25, 0.25),
        (1.0, 0.0, 0.0, 0.0),
    ],
)
def test_compensation_share_is_the_imbalance_capped(
    home: float, other: float, max_share: float, expected: float
) -> None:
    share = compensation_share(home, other, max_share)
    assert share == pytest.approx(expected)
    assert 0.0 <= share <= max_share


def test_an_empty_home_group_sends_to_the_other_without_counting_compensation() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    split = groups_after_first(policy)
    only_short = tuple(sorted(split[SHORT]))
    assert policy.choose(LONG_PROMPT, views(only_short)) in split[SHORT]
    assert policy.stats()["shard_compensated"] == 0
    assert policy.stats()["shard_short"] == 2


def test_labels_override_placement() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    policy.choose(LONG_PROMPT, views(("r0",)))
    policy.forget("r0")
    labelled = [
        ReplicaView("r0", in_flight=0, group="long"),
        ReplicaView("r1", in_flight=0, group="long"),
        ReplicaView("r2", in_flight=0, group="long"),
        ReplicaView("r3", in_flight=0, group="short"),
    ]
    assert {policy.choose(SHORT_PROMPT, labelled) for _ in range(50)} == {"r3"}
    assert {policy.choose(LONG_PROMPT, labelled) for _ in range(50)} == {"r0", "r1", "r2"}
    # An unlabelled newcomer fills the short group, which is further below its target.
    policy.choose(SHORT_PROMPT, [*labelled, ReplicaView("r4", in_flight=0)])
    assert policy.group_of("r4") == SHORT


def test_a_single_replica_gets_everything() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    only = [ReplicaView("solo", in_flight=0)]
    assert policy.choose(SHORT_PROMPT, only) == "solo"
    assert policy.choose(LONG_PROMPT, only) == "solo"
    assert policy.stats()["shard_compensated"] == 0


def test_forget_removes_a_replica_and_a_newcomer_takes_its_place() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    split = groups_after_first(policy)
    gone = sorted(split[LONG])[0]
    policy.forget(gone)
    assert policy.group_of(gone) is None
    remaining = tuple(rid for rid in IDS if rid != gone)
    policy.choose(SHORT_PROMPT, views((*remaining, "r9")))
    assert policy.group_of("r9") == LONG


def test_length_shard_identity_and_default_inner_policy() -> None:
    policy = LengthShard(CONFIG, random.Random(0))
    assert policy.name == "length_shard"
    assert policy.uses_prefix is False


# --- Hybrid --------------------------------------------------------------------------------

BLOCK = 16
HYBRID_CONFIG = RoutingConfig(prefix_block_chars=BLOCK, long_group_share=0.5)


def hybrid_request(text: str, tokens: int) -> RequestView:
    return RequestView(
        model="m",
        prompt_tokens=tokens,
        prefix_hashes=prefix_hashes(text, BLOCK, HYBRID_CONFIG.prefix_max_blocks),
    )


def test_hybrid_shards_by_length_and_keeps_prefixes_within_a_group() -> None:
    policy = Hybrid(HYBRID_CONFIG, random.Random(0))
    candidates = [ReplicaView(f"r{i}", in_flight=0) for i in range(6)]
    # Both kinds of traffic exist (prompts under one block: no prefix blocks): no lending.
    policy.choose(hybrid_request("x", 9000), candidates)
    policy.choose(hybrid_request("y", 200), candidates)
    rng = random.Random(2)
    prefixes = ["".join(rng.choice("abcdefgh") for _ in range(6 * BLOCK)) for _ in range(8)]
    landed: dict[tuple[int, bool], set[str]] = defaultdict(set)
    for i in range(600):
        group, long = rng.randrange(8), rng.random() < 0.3
        text = prefixes[group] + str(i) * 5
        tokens = 9000 if long else 200
        landed[(group, long)].add(policy.choose(hybrid_request(text, tokens), candidates))
    long_ids = {f"r{i}" for i in range(6) if policy.group_of(f"r{i}") == LONG}
    assert len(long_ids) == 3
    for (_, long), replicas in landed.items():
        assert len(replicas) == 1  # a shared prefix sticks to one replica...
        assert replicas <= long_ids if long else not replicas & long_ids  # ...in its group
    stats = policy.stats()
    assert stats["shard_short"] + stats["shard_long"] == 602
    assert stats["shard_compensated"] == 0
    assert stats["prefix_blocks_total"] == 600 * 6
    assert stats["prefix_blocks_matched"] == stats["prefix_blocks_total"] - 6 * len(landed)


def test_hybrid_identity_and_table_split() -> None:
    policy = Hybrid(
        RoutingConfig(prefix_block_chars=BLOCK, prefix_table_blocks=8), random.Random(0)
    )
    assert policy.name == "hybrid"
    assert policy.uses_prefix is True
    candidates = [ReplicaView(f"r{i}", in_flight=0) for i in range(2)]
    for seed in range(10):
        text = "".join(random.Random(seed).choice("xyz") for _ in range(4 * BLOCK))
        policy.choose(hybrid_request(text, 100 if seed % 2 else 9000), candidates)
    # Two groups, each with half of the 8 blocks the config allows.
    assert policy.stats()["prefix_table_blocks"] == 8
