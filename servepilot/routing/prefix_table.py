"""The gateway's guess at each replica's prefix cache: which replica last got each block.

Prefix-aware policies (prefix_affinity, predicted_latency) share this one table: a bounded
LRU map of each chained block hash (`routing.prefix`) to the replica that most recently
received that block, which probably still holds it in its vLLM prefix cache. The table
ignores what vLLM actually evicts; it forgets only by its own bound.
"""

from __future__ import annotations

from collections import OrderedDict

from mypy_extensions import mypyc_attr

from servepilot.core.config import RoutingConfig
from servepilot.routing.base import RequestView
from servepilot.routing.kv_index import KvIndex


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixTable:
    """Block hash -> the replica last sent that block, `max_blocks` at most."""

    def __init__(self, max_blocks: int) -> None:
        self._max_blocks = max(1, max_blocks)
        self._table: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def holders(self, hashes: tuple[int, ...]) -> dict[str, int]:
        """Each replica holding part of the prefix -> blocks it holds, longest holder first.

        Walking from the last block down finds the longest match even when the LRU has evicted
        some shorter block in between: a chained hash found at block i implies blocks 0..i.
        """
        held: dict[str, int] = {}
        lookup = self._table.get
        for index in range(len(hashes) - 1, -1, -1):
            owner = lookup(hashes[index])
            if owner is not None and owner not in held:
                held[owner] = index + 1
        return held

    def record(self, hashes: tuple[int, ...], replica_id: str) -> None:
        """The request with these blocks was sent to `replica_id`."""
        table = self._table
        # Last block first, so the leading blocks end up most recently used and the deepest
        # ones are evicted first, as vLLM frees a request's blocks tail first.
        for block in reversed(hashes):
            table[block] = replica_id
            table.move_to_end(block)
        while len(table) > self._max_blocks:
            table.popitem(last=False)

    def forget(self, replica_id: str) -> None:
        stale = [block for block, owner in self._table.items() if owner == replica_id]
        for block in stale:
            del self._table[block]


@mypyc_attr(allow_interpreted_subclasses=True)
class GuessedPrefixIndex:
    """A `PrefixIndex` (routing.predicted) on a `PrefixTable`: what the gateway sent where.

    Its blocks are characters (`prefix_block_chars`), turned into tokens at the routing
    estimate (`chars_per_token`). It learns only from `record`, so the policy that uses it
    records every decision; an exact index fed by the replicas' KV events needs no such help.
    """

    def __init__(self, config: RoutingConfig, kv_index: KvIndex | None = None) -> None:
        self.table = PrefixTable(config.prefix_table_blocks)
        self._tokens_per_block = config.prefix_block_chars / config.chars_per_token
        self._kv_index = kv_index

    def cached_tokens(self, request: RequestView) -> dict[str, int]:
        """Tokens of this request each replica holds: exact where the replica's KV events
        flow (`kv_index`), else the table's guess."""
        per_block = self._tokens_per_block
        held = self.table.holders(request.prefix_hashes)
        tokens = {replica_id: int(blocks * per_block) for replica_id, blocks in held.items()}
        index, blocks = self._kv_index, request.kv_block_hashes
        if index is not None and blocks:
            for replica_id in index.exact_replicas():
                exact = index.cached_prefix_tokens(replica_id, blocks)
                if exact:
                    tokens[replica_id] = exact
                else:
                    tokens.pop(replica_id, None)
        return tokens

    def record(self, request: RequestView, replica_id: str) -> None:
        self.table.record(request.prefix_hashes, replica_id)

    def forget(self, replica_id: str) -> None:
        self.table.forget(replica_id)
