"""Session affinity: keep an `X-Session-Id` on the replica that served it last."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from mypy_extensions import mypyc_attr

from servepilot.core.config import RoutingConfig
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.bounded_load import load_bound, replica_load
from servepilot.routing.least_load import LeastLoad


@mypyc_attr(allow_interpreted_subclasses=True)
class SessionAffinity:
    """Binds each session id to a replica, so a conversation reuses that replica's KV cache.

    A binding lives `session_ttl_s` after the session's last request (time is the requests'
    `arrival_s`) and the table holds `session_table_size` sessions at most, least recently
    used forgotten first. When the bound replica is not a candidate (unhealthy, draining or
    full) or is above the bounded-load line, the request goes to power-of-two least load and
    the session is rebound there: its next turns then find their cache on the new replica.
    Requests without a session id use least load and are not counted.
    """

    name = "session"
    uses_prefix = False

    def __init__(self, config: RoutingConfig, rng: random.Random) -> None:
        self._ttl_s = config.session_ttl_s
        self._table_size = config.session_table_size
        self._epsilon = config.balance_epsilon
        # session id -> (replica id, last use), in least-recently-used-first order.
        self._table: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._fallback = LeastLoad(rng)
        self._hits = 0
        self._misses = 0
        self._rebinds = 0

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        session = request.session_id
        if not session:
            return self._fallback.choose(request, candidates)
        now = request.arrival_s
        bound = self._live_binding(session, now)
        if bound is None:
            self._misses += 1
            chosen = self._fallback.choose(request, candidates)
        elif self._usable(bound, candidates):
            self._hits += 1
            chosen = bound
        else:
            self._rebinds += 1
            others = [view for view in candidates if view.replica_id != bound]
            chosen = self._fallback.choose(request, others or candidates)
        self._bind(session, chosen, now)
        return chosen

    def forget(self, replica_id: str) -> None:
        stale = [session for session, (bound, _) in self._table.items() if bound == replica_id]
        for session in stale:
            del self._table[session]

    def stats(self) -> Mapping[str, float]:
        return {
            "sessions": float(len(self._table)),
            "session_hits": float(self._hits),
            "session_misses": float(self._misses),
            "session_rebinds": float(self._rebinds),
        }

    def _live_binding(self, session: str, now: float) -> str | None:
        binding = self._table.get(session)
        if binding is None:
            return None
        replica_id, last_use = binding
        if now - last_use > self._ttl_s:
            del self._table[session]
            return None
        return replica_id

    def _usable(self, replica_id: str, candidates: Sequence[ReplicaView]) -> bool:
        for view in candidates:
            if view.replica_id == replica_id:
                return replica_load(view) <= load_bound(candidates, self._epsilon)
        return False

    def _bind(self, session: str, replica_id: str, now: float) -> None:
        table = self._table
        previous = table.get(session)
        # Requests may reach the policy slightly out of arrival order; never move a session's
        # last use back in time.
        last_use = now if previous is None else max(now, previous[1])
        table[session] = (replica_id, last_use)
        table.move_to_end(session)
        self._evict(now)

    def _evict(self, now: float) -> None:
        # The table is in last-use order, so expired sessions gather at its head: dropping
        # them here, with the least recently used beyond the bound, costs O(1) amortised.
        table = self._table
        while table:
            _, (_, last_use) = next(iter(table.items()))
            if len(table) <= self._table_size and now - last_use <= self._ttl_s:
                return
            table.popitem(last=False)
