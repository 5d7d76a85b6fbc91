"""Prefix affinity with the exact index: replicas whose KV events flow are judged by what they
hold, the others by the approximate table; the two compare in tokens."""

from __future__ import annotations

import random

from servepilot.core.config import RoutingConfig
from servepilot.routing import make_policy
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.kv_index import (
    BlockHashing,
    BlockStored,
    KvIndex,
    external_hash,
    prompt_block_hashes,
)
from servepilot.routing.prefix_affinity import PrefixAffinity

HASHING = BlockHashing(block_size=4)
# One table block = 16 characters = 4 tokens at 4 characters a token.
CONFIG = RoutingConfig(prefix_block_chars=16, prefix_max_blocks=64, chars_per_token=4.0)
VIEWS = [ReplicaView("a", 0), ReplicaView("b", 0)]


def _holding(index: KvIndex, replica: str, tokens: list[int]) -> None:
    index.attach(replica)
    digests = prompt_block_hashes([*tokens, 0], HASHING)
    stored = BlockStored(tuple(external_hash(d) for d in digests), None, tuple(tokens), 4, "GPU")
    index.apply(replica, index.expected_seq(replica), [stored])


def _request(text_hashes: tuple[int, ...], tokens: list[int]) -> RequestView:
    blocks = tuple(prompt_block_hashes(tokens, HASHING))
    return RequestView("m", prefix_hashes=text_hashes, kv_block_hashes=blocks)


def test_the_replica_that_really_holds_the_prefix_wins_over_the_guess() -> None:
    index = KvIndex(HASHING)
    policy = PrefixAffinity(CONFIG, random.Random(1), kv_index=index)
    prompt = list(range(17))
    # The table guesses that "a" holds the text (it was sent there)...
    assert policy.choose(_request((1, 2, 3), prompt), [VIEWS[0]]) == "a"
    # ...but "a" evicted it, and "b" holds 12 of its tokens, as their events say.
    _holding(index, "a", [])
    _holding(index, "b", prompt[:12])
    assert policy.choose(_request((1, 2, 3), prompt), VIEWS) == "b"
    stats = policy.stats()
    assert stats["exact_routed"] == 1
    assert stats["exact_cached_tokens_predicted"] == 12


def test_a_guessed_replica_competes_in_tokens_with_an_exact_one() -> None:
    index = KvIndex(HASHING)
    policy = PrefixAffinity(CONFIG, random.Random(1), kv_index=index)
    prompt = list(range(40))
    # The table says "a" (no events) holds 3 blocks of text: 12 tokens.
    policy.choose(_request((1, 2, 3), prompt), [VIEWS[0]])
    _holding(index, "b", prompt[:8])  # exact: 8 tokens
    assert policy.choose(_request((1, 2, 3, 4), prompt), VIEWS) == "a"
    _holding(index, "b", prompt[:20])  # exact: 20 tokens, more than the guess
    assert policy.choose(_request((1, 2, 3, 4), prompt), VIEWS) == "b"


def test_without_token_ids_the_table_alone_decides() -> None:
    index = KvIndex(HASHING)
    policy = make_policy("prefix_affinity", CONFIG, seed=1, kv_index=index)
    _holding(index, "b", list(range(12)))
    policy.choose(RequestView("m", prefix_hashes=(7, 8)), [VIEWS[0]])
    assert policy.choose(RequestView("m", prefix_hashes=(7, 8)), VIEWS) == "a"
    assert make_policy("hybrid", CONFIG, seed=1, kv_index=index).uses_prefix
