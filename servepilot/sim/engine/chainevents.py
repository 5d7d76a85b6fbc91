"""A replica's prefix chains' changes as vLLM's KV event records (BlockStored, BlockRemoved).

The block pool notes each change of a prefix group's chain as `(group, first block, end
block, stored)` (kvblocks.py). What hash a block carries depends on who runs the replica:
the fleet simulator, which has no token ids, packs (group, block) into one int
(sim/fleet/kvevents.py); the simulated replica server hashes the prompt's tokens as vLLM does
(engine/simserver/prefixmap.py). Both turn their notes into records here, the records the
gateway's index applies (`routing.kv_index`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from servepilot.routing.kv_index import GPU_MEDIUM, BlockRemoved, BlockStored, KvEvent
from servepilot.sim.engine.kvblocks import ChainNote


class ChainBlocks(Protocol):
    """What the blocks of a replica's prefix chains are."""

    def block_keys(self, group: int, first: int, end: int) -> Sequence[int] | None:
        """The hashes of blocks [first, end) of the group's chain, as the index keys them;
        None for a chain no lookup can reach any more (its changes are not published)."""
        ...

    def block_tokens(self, group: int, first: int, end: int) -> tuple[int, ...]:
        """The token ids of those blocks; () where they are not known."""
        ...


def chain_records(
    notes: Iterable[ChainNote], block_size: int, chains: ChainBlocks
) -> list[KvEvent]:
    """The records of the notes, in order: a store names the block before it as its parent,
    as vLLM's BlockStored does."""
    records: list[KvEvent] = []
    for group, first, end, stored in notes:
        start = first - 1 if stored and first else first
        keys = chains.block_keys(group, start, end)
        if keys is None:
            continue
        if not stored:
            records.append(BlockRemoved(tuple(keys), GPU_MEDIUM))
            continue
        parent = keys[0] if start < first else None
        hashes = tuple(keys[first - start :])
        tokens = chains.block_tokens(group, first, end)
        records.append(BlockStored(hashes, parent, tokens, block_size, GPU_MEDIUM))
    return records
