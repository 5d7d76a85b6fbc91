"""Prefix groups for HTTP requests: which earlier prompt a new prompt shares its first blocks with.

The replica model caches prefixes per *group* (a chain of full blocks that requests of the
group share, see kvblocks.py), not per block hash. A server sees token ids, so it maps them
onto groups the way vLLM's block hashes would match them, as far as one chain per group can:

- a prompt's full blocks are hashed as vLLM does, each hash covering everything before it;
- prompts whose first block is the same belong to one group, whose chain is the longest run
  of blocks seen for it; a prompt shares `prefix_tokens` = the blocks it has in common with
  that chain (and extends the chain when it continues it, as the next turn of a chat does);
- a prompt that diverges from the chain keeps its other blocks to itself. vLLM would find
  them for a later identical prompt; here only the group's one chain can be hit (so two
  different user turns after one system prompt share the system prompt, not each other's
  turns).

The map keeps the `capacity` most recently used groups (a bounded memory for long runs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_CAPACITY = 4096


class _Chain:
    __slots__ = ("group", "hashes")

    def __init__(self, group: int, hashes: list[int]) -> None:
        self.group = group
        self.hashes = hashes


class PrefixMap:
    def __init__(self, block_size: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._chains: OrderedDict[int, _Chain] = OrderedDict()
        self._next_group = 0

    def assign(self, token_ids: Sequence[int]) -> tuple[int | None, int]:
        """(prefix_group, prefix_tokens) for a prompt; (None, 0) below one full block."""
        hashes = block_hashes(token_ids, self.block_size)
        if not hashes:
            return None, 0
        chain = self._chains.get(hashes[0])
        if chain is None:
            chain = self._new_chain(hashes)
        else:
            self._chains.move_to_end(hashes[0])
        known = chain.hashes
        common = 0
        for mine, theirs in zip(hashes, known, strict=False):
            if mine != theirs:
                break
            common += 1
        if common == len(known) and len(hashes) > common:
            known.extend(hashes[common:])  # it continues the chain: the chain grows
            common = len(hashes)
        return chain.group, common * self.block_size

    def forget(self) -> None:
        """Drop every chain (vLLM's sleep drops the KV cache). Group numbers go on from where
        they were: the replica model still holds the old groups' blocks, now unreachable."""
        self._chains.clear()

    def _new_chain(self, hashes: list[int]) -> _Chain:
        chain = _Chain(self._next_group, list(hashes))
        self._next_group += 1
        self._chains[hashes[0]] = chain
        if len(self._chains) > self.capacity:
            self._chains.popitem(last=False)
        return chain


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One hash per full block, each over the previous hash and the block's ids."""
    hashes = []
    previous = 0
    for end in range(block_size, len(token_ids) + 1, block_size):
        previous = hash((previous, tuple(token_ids[end - block_size : end])))
        hashes.append(previous)
    return hashes
