"""Prefix affinity: send a request where its prompt's leading blocks were last sent."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from mypy_extensions import mypyc_attr

from servepilot.core.config import RoutingConfig
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.bounded_load import load_bound, replica_load
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
    """

    name = "prefix_affinity"
    uses_prefix = True

    def __init__(
        self, config: RoutingConfig, rng: random.Random, *, table_blocks: int | None = None
    ) -> None:
        self._epsilon = config.balance_epsilon
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
        chosen, overloaded = self._affine(held, candidates)
        if chosen is None:
            # The overloaded holders are above the line by definition, so at least one
            # candidate remains; the guard only protects against a degenerate snapshot.
            spill = [view for view in candidates if view.replica_id not in overloaded]
            chosen = self._fallback.choose(request, spill or candidates)
        self._blocks_total += len(hashes)
        self._blocks_matched += held.get(chosen, 0)
        self._table.record(hashes, chosen)
        return chosen

    def forget(self, replica_id: str) -> None:
        self._table.forget(replica_id)

    def stats(self) -> Mapping[str, float]:
        return {
            "prefix_blocks_total": float(self._blocks_total),
            "prefix_blocks_matched": float(self._blocks_matched),
            "prefix_table_blocks": float(len(self._table)),
        }

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
