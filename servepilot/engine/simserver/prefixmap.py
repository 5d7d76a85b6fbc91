"""Prefix groups for HTTP requests: which earlier prompt a new prompt shares its first blocks with.

The replica model caches prefixes per *group* (a chain of full blocks that requests of the
group share, see kvblocks.py), not per block hash. A server sees token ids, so it maps them
onto groups the way vLLM's block hashes would match them, as far as one chain per group can:

- a prompt's full blocks are hashed as vLLM hashes them (`routing.kv_index`, the gateway's
  own keying: sha256, the seed, the block size), each hash covering everything before it;
- prompts whose first block is the same belong to one group, whose chain is the longest run
  of blocks seen for it; a prompt shares `prefix_tokens` = the blocks it has in common with
  that chain (and extends the chain when it continues it, as the next turn of a chat does);
- a prompt that diverges from the chain keeps its other blocks to itself. vLLM would find
  them for a later identical prompt; here only the group's one chain can be hit (so two
  different user turns after one system prompt share the system prompt, not each other's
  turns).

The map keeps the `capacity` most recently used groups (a bounded memory for long runs). It
is also what the replica's KV events say its blocks are (`ChainBlocks`): block i of group g
has the hash of its chain's block i, so the gateway keys a prompt to the same hashes. A group
that falls out of the map can be hit no more: `on_drop` hears a BlockRemoved of its blocks
(its later changes are not published), and AllBlocksCleared when the map forgets them all.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

from servepilot.routing.kv_index import (
    GPU_MEDIUM,
    AllBlocksCleared,
    BlockHashing,
    BlockRemoved,
    KvEvent,
    chained_hashes,
    external_hash,
    root_hash,
)

DEFAULT_CAPACITY = 4096


class _Chain:
    __slots__ = ("group", "keys", "last", "tokens")

    def __init__(self, group: int, keys: list[int], last: bytes, tokens: array[int] | None) -> None:
        self.group = group
        self.keys = keys
        """Each block's hash as the index keys it (the low 64 bits of vLLM's digest)."""
        self.last = last
        """The last block's whole digest: the parent of the block that extends the chain."""
        self.tokens = tokens
        """The chain's token ids (for BlockStored's token_ids), where events are published."""


class PrefixMap:
    def __init__(
        self,
        hashing: BlockHashing,
        capacity: int = DEFAULT_CAPACITY,
        *,
        on_drop: Callable[[KvEvent], None] | None = None,
    ) -> None:
        """`on_drop`: told when groups can be hit no more (the replica's KV events); the
        chains then keep their token ids too."""
        self.hashing = hashing
        self.block_size = hashing.block_size
        self.capacity = capacity
        self._on_drop = on_drop
        self._root = root_hash(hashing)
        self._chains: OrderedDict[int, _Chain] = OrderedDict()
        """By the key of their first block, least recently used first."""
        self._groups: dict[int, _Chain] = {}
        self._next_group = 0

    def assign(self, token_ids: Sequence[int]) -> tuple[int | None, int]:
        """(prefix_group, prefix_tokens) for a prompt; (None, 0) below one full block."""
        size = self.block_size
        full = len(token_ids) // size * size
        if not full:
            return None, 0
        digests = chained_hashes(token_ids[:full], self.hashing, self._root)
        keys = [external_hash(digest) for digest in digests]
        chain = self._chains.get(keys[0])
        if chain is None:
            chain = self._new_chain(keys, digests[-1], token_ids[:full])
        else:
            self._chains.move_to_end(keys[0])
        known = chain.keys
        common = 0
        for mine, theirs in zip(keys, known, strict=False):
            if mine != theirs:
                break
            common += 1
        if common == len(known) and len(keys) > common:
            # It continues the chain: the chain grows.
            known.extend(keys[common:])
            chain.last = digests[-1]
            if chain.tokens is not None:
                chain.tokens.extend(token_ids[common * size : full])
            common = len(keys)
        return chain.group, common * size

    def forget(self) -> None:
        """Drop every chain (vLLM's sleep drops the KV cache). Group numbers go on from where
        they were: the replica model still holds the old groups' blocks, now unreachable."""
        self._chains.clear()
        self._groups.clear()
        if self._on_drop is not None:
            self._on_drop(AllBlocksCleared())

    # ---- ChainBlocks (sim/engine/chainevents.py) ---------------------------------------

    def block_keys(self, group: int, first: int, end: int) -> Sequence[int] | None:
        chain = self._groups.get(group)
        return None if chain is None else chain.keys[first:end]

    def block_tokens(self, group: int, first: int, end: int) -> tuple[int, ...]:
        chain = self._groups.get(group)
        if chain is None or chain.tokens is None:
            return ()
        return tuple(chain.tokens[first * self.block_size : end * self.block_size])

    def _new_chain(self, keys: list[int], last: bytes, token_ids: Sequence[int]) -> _Chain:
        # 64-bit ids: the approximate tokenizer's go past 32 bits.
        tokens = array("q", token_ids) if self._on_drop is not None else None
        chain = _Chain(self._next_group, list(keys), last, tokens)
        self._next_group += 1
        self._chains[keys[0]] = chain
        self._groups[chain.group] = chain
        if len(self._chains) > self.capacity:
            _, dropped = self._chains.popitem(last=False)
            del self._groups[dropped.group]
            if self._on_drop is not None:
                self._on_drop(BlockRemoved(tuple(dropped.keys), GPU_MEDIUM))
        return chain
