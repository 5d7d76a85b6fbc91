"""The exact KV block index: vLLM's own hashes, its events, gaps, restarts and eviction."""

from __future__ import annotations

import hashlib
import pickle
import random

import pytest

from servepilot.routing.kv_index import (
    AllBlocksCleared,
    Applied,
    BlockHashing,
    BlockRemoved,
    BlockStored,
    KvIndex,
    external_hash,
    prompt_block_hashes,
)

HASHING = BlockHashing(block_size=4)


def _stored(digests: list[bytes], tokens: list[int], block_size: int = 4) -> BlockStored:
    return BlockStored(
        block_hashes=tuple(external_hash(d) for d in digests),
        parent_block_hash=None,
        token_ids=tuple(tokens),
        block_size=block_size,
        medium="GPU",
    )


def _index_with(replica: str, tokens: list[int]) -> tuple[KvIndex, list[bytes]]:
    index = KvIndex(HASHING)
    index.attach(replica)
    # What vLLM stores after serving `tokens`: every full block (the last token's too).
    digests = prompt_block_hashes([*tokens, 0], HASHING)
    assert index.apply(replica, 0, [_stored(digests, tokens)]) is Applied.OK
    return index, digests


def test_first_block_hash_is_a_known_answer() -> None:
    none_hash = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()
    expected = hashlib.sha256(pickle.dumps((none_hash, (1, 2, 3, 4), None), protocol=5)).digest()
    assert prompt_block_hashes([1, 2, 3, 4, 5], HASHING) == [expected]


def test_only_blocks_vllm_could_reuse_are_hashed() -> None:
    # vLLM keeps the last prompt token to compute: 8 tokens reuse at most one 4-token block.
    assert len(prompt_block_hashes(list(range(8)), HASHING)) == 1
    assert len(prompt_block_hashes(list(range(9)), HASHING)) == 2
    assert prompt_block_hashes([], HASHING) == []


def test_a_chain_continues_from_its_parent() -> None:
    tokens = list(range(13))
    whole = prompt_block_hashes(tokens, HASHING)
    tail = prompt_block_hashes(tokens[4:], HASHING, parent=whole[0])
    assert tail == whole[1:]


def test_hashes_match_vllms_own() -> None:
    """The installed vLLM's hash_block_tokens and ours agree, block for block, and on the
    64-bit form its events carry."""
    utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    hashing_mod = pytest.importorskip("vllm.utils.hashing")
    utils.init_none_hash(hashing_mod.sha256)
    rng = random.Random(35)
    for block_size, length in [(16, 17), (16, 100), (128, 1000), (128, 129), (32, 31)]:
        tokens = [rng.randrange(49_152) for _ in range(length)]
        theirs: list[bytes] = []
        parent = None
        for start in range(0, (length - 1) // block_size * block_size, block_size):
            parent = utils.hash_block_tokens(
                hashing_mod.sha256, parent, tokens[start : start + block_size]
            )
            theirs.append(parent)
        ours = prompt_block_hashes(tokens, BlockHashing(block_size=block_size))
        assert ours == theirs
        assert [external_hash(d) for d in ours] == [
            utils.maybe_convert_block_hash(d) for d in theirs
        ]


def test_cached_prefix_counts_leading_blocks_up_to_the_first_missing() -> None:
    tokens = list(range(12))
    index, digests = _index_with("r1", tokens)
    assert index.cached_prefix_tokens("r1", digests) == 12
    # The same first block, then another continuation: one block in common.
    other = prompt_block_hashes([0, 1, 2, 3, 9, 9, 9, 9, 9], HASHING)
    assert index.cached_prefix_tokens("r1", other) == 4
    assert index.cached_prefix_tokens("r2", digests) == 0


def test_a_removed_block_ends_the_prefix_there() -> None:
    index, digests = _index_with("r1", list(range(12)))
    index.apply("r1", 1, [BlockRemoved((external_hash(digests[1]),), "GPU")])
    assert index.cached_prefix_tokens("r1", digests) == 4
    assert index.blocks_held("r1") == 2
    index.apply("r1", 2, [AllBlocksCleared()])
    assert index.cached_prefix_tokens("r1", digests) == 0


def test_offloaded_tiers_are_not_indexed() -> None:
    index = KvIndex(HASHING)
    index.attach("r1")
    digests = prompt_block_hashes(list(range(5)), HASHING)
    stored = BlockStored((external_hash(digests[0]),), None, (0, 1, 2, 3), 4, medium="CPU")
    index.apply("r1", 0, [stored])
    assert index.cached_prefix_tokens("r1", digests) == 0


def test_a_gap_is_not_applied_and_a_replay_fills_it() -> None:
    index, digests = _index_with("r1", list(range(12)))
    removed = BlockRemoved((external_hash(digests[0]),), "GPU")
    assert index.apply("r1", 3, [removed]) is Applied.GAP
    assert index.cached_prefix_tokens("r1", digests) == 12
    assert index.expected_seq("r1") == 1
    assert index.apply("r1", 1, []) is Applied.OK
    assert index.apply("r1", 2, []) is Applied.OK
    assert index.apply("r1", 3, [removed]) is Applied.OK
    assert index.apply("r1", 2, []) is Applied.DUPLICATE
    assert index.cached_prefix_tokens("r1", digests) == 0


def test_resync_forgets_and_goes_on_from_the_given_batch() -> None:
    index, digests = _index_with("r1", list(range(12)))
    index.resync("r1", 7)
    assert index.blocks_held("r1") == 0
    assert index.apply("r1", 7, [_stored(digests[:1], [0, 1, 2, 3])]) is Applied.OK
    assert index.cached_prefix_tokens("r1", digests) == 4


def test_a_restarted_publisher_clears_the_replica() -> None:
    index, digests = _index_with("r1", list(range(12)))
    index.apply("r1", 1, [])
    fresh = prompt_block_hashes([7, 7, 7, 7, 7], HASHING)
    assert index.apply("r1", 0, [_stored(fresh, [7, 7, 7, 7])]) is Applied.RESTARTED
    assert index.cached_prefix_tokens("r1", digests) == 0
    assert index.cached_prefix_tokens("r1", fresh) == 4


def test_exactness_follows_attach_detach_and_block_size() -> None:
    index, digests = _index_with("r1", list(range(12)))
    assert index.is_exact("r1") and index.why_not_exact("r1") is None
    index.detach("r1", "KV events are not flowing from r1")
    assert not index.is_exact("r1")
    assert index.cached_prefix_tokens("r1", digests) == 0
    assert index.why_not_exact("r1") == "KV events are not flowing from r1"
    assert index.why_not_exact("r9") == "no KV event subscription"
    index.attach("r1")
    assert index.cached_prefix_tokens("r1", digests) == 12
    # A replica whose blocks are another size can never match our hashes: guessed for good.
    index.apply("r1", 1, [_stored(digests[:1], list(range(16)), block_size=16)])
    assert not index.is_exact("r1")
    index.attach("r1")
    assert not index.is_exact("r1")
    assert "16 tokens" in (index.why_not_exact("r1") or "")


def test_forget_drops_everything_about_a_replica() -> None:
    index, digests = _index_with("r1", list(range(12)))
    index.forget("r1")
    assert not index.is_exact("r1")
    assert index.expected_seq("r1") == 0
    assert index.cached_prefix_tokens("r1", digests) == 0


def test_int_hashes_are_keyed_by_their_low_64_bits_like_digests() -> None:
    """A publisher's ints may be signed or wider than 64 bits; a prompt's digests, ints in
    range (the simulator's) and out of range all meet on the low 64 bits."""
    index = KvIndex(HASHING)
    index.attach("r1")
    digests = prompt_block_hashes(list(range(13)), HASHING)  # 3 blocks
    low = [external_hash(d) for d in digests]
    wide = (low[0] | 1 << 70, low[1] - (1 << 64), low[2])  # the same blocks, other spellings
    index.apply("r1", 0, [BlockStored(wide, None, (), 4)])
    assert index.blocks_held("r1") == 3
    assert index.cached_prefix_tokens("r1", digests) == 12
    assert index.cached_prefix_tokens("r1", low) == 12
    assert index.cached_prefix_tokens("r1", [low[0], low[1] + 1, low[2]]) == 4
    index.apply("r1", 1, [BlockRemoved((low[1] - (1 << 64),))])
    assert index.cached_prefix_tokens("r1", low) == 4
