"""Prefix affinity: send a request where its prompt's leading blocks were last sent."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from mypy_extensions import mypyc_attr

from servepilot.core.config import RoutingConfig
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.bounded_load import load_bound, replica_load
from servepilot.routing.kv_index import KvIndex
from servepilot.routing.least_load import LeastLoad
from servepilot.routing.prefix_table import PrefixTable


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixAffinity:
    """Cache-aware routing on an approximate, gateway-side map of each replica's prefix cache.

    A `PrefixTable` maps each chained block hash (`routing.prefix`) to the replica that most
    recently received that block; that replica probably still holds it in its vLLM prefix
    cache. A request goes to the replica holding its longest prefix, unless that replica is not
    a candidate or is above the bounded-load line (`bounded_load`), in which case the next
    longest holder is tried, and then power-of-two least load. The chosen replica is then
    recorded for every block of the request.

    The table ignores what vLLM actually evicts; it only forgets by its own LRU bound, so its
    hit rate (`prefix_blocks_matched / prefix_blocks_total`) is an estimate.

    With a `KvIndex`, a replica whose KV events flow (`is_exact`) is judged by the prompt
    tokens it really holds (`RequestView.kv_block_hashes`), and the table is asked only about
    the others; the two compare in tokens (the table's blocks at `chars_per_token`).
    """

    name = "prefix_affinity"
    uses_prefix = True

    def __init__(
        self,
        config: RoutingConfig,
        rng: random.Random,
        *,
        table_blocks: int | None = None,
        kv_index: KvIndex | None = None,
    ) -> None:
        self._epsilon = config.balance_epsilon
        self._kv_index = kv_index
        self._tokens_per_block = config.prefix_block_chars / config.chars_per_token
        self._exact_predicted_tokens = 0
        self._exact_routed = 0
        self._table = PrefixTable(
            config.prefix_table_blocks if table_blocks is None else table_blocks
        )
        self._fallback = LeastLoad(rng)
        self._blocks_total = 0
        self._blocks_matched = 0

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        hashes = request.prefix_hashes
        if not hashes:
            return self._fallback.choose(request, candidates)
        held = self._table.holders(hashes)
        exact = self._exact_holders(request, candidates)
        ranked = self._ranked(held, exact) if exact is not None else held
        chosen, overloaded = self._affine(ranked, candidates)
        if chosen is None:
            # The overloaded holders are above the line by definition, so at least one
            # candidate remains; the guard only protects against a degenerate snapshot.
            spill = [view for view in candidates if view.replica_id not in overloaded]
            chosen = self._fallback.choose(request, spill or candidates)
        self._blocks_total += len(hashes)
        self._blocks_matched += held.get(chosen, 0)
        if exact is not None and chosen in exact:
            self._exact_routed += 1
            self._exact_predicted_tokens += exact[chosen]
        self._table.record(hashes, chosen)
        return chosen

    def forget(self, replica_id: str) -> None:
        self._table.forget(replica_id)

    def stats(self) -> Mapping[str, float]:
        stats = {
            "prefix_blocks_total": float(self._blocks_total),
            "prefix_blocks_matched": float(self._blocks_matched),
            "prefix_table_blocks": float(len(self._table)),
        }
        if self._kv_index is not None:
            stats["exact_routed"] = float(self._exact_routed)
            stats["exact_cached_tokens_predicted"] = float(self._exact_predicted_tokens)
        return stats

    def _exact_holders(
        self, request: RequestView, candidates: Sequence[ReplicaView]
    ) -> dict[str, int] | None:
        """Each candidate whose events flow -> prompt tokens it holds; None without an index
        or token ids (nothing is exact then)."""
        index = self._kv_index
        if index is None or not request.kv_block_hashes:
            return None
        blocks = request.kv_block_hashes
        return {
            view.replica_id: index.cached_prefix_tokens(view.replica_id, blocks)
            for view in candidates
            if index.is_exact(view.replica_id)
        }

    def _ranked(self, held: Mapping[str, int], exact: Mapping[str, int]) -> dict[str, int]:
        """Exact and guessed holders together, longest prefix in tokens first; a replica whose
        events flow is never judged by the table's guess."""
        per_block = self._tokens_per_block
        tokens = {rid: int(n * per_block) for rid, n in held.items() if rid not in exact}
        tokens.update((rid, n) for rid, n in exact.items() if n > 0)
        return dict(sorted(tokens.items(), key=lambda item: item[1], reverse=True))

    def _affine(
        self, held: Mapping[str, int], candidates: Sequence[ReplicaView]
    ) -> tuple[str | None, set[str]]:
        """The longest holder that is a candidate under the load bound, and those over it."""
        overloaded: set[str] = set()
        if not held:
            return None, overloaded
        views = {view.replica_id: view for view in candidates}
        bound = load_bound(candidates, self._epsilon)
        for owner in held:
            view = views.get(owner)
            if view is None:
                continue
            if replica_load(view) <= bound:
                return owner, overloaded
            overloaded.add(owner)
        return None, overloaded
