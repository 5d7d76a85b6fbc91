"""Least load by power-of-two choices: sample two candidates, send to the less loaded one."""

from __future__ import annotations

import random
from collections.abc import Sequence

from servepilot.routing.base import ReplicaView, RequestView, StatelessPolicy


def load_key(view: ReplicaView) -> tuple[int, float, int]:
    """Order replicas by load: in-flight plus queued, then KV cache use, then in-flight."""
    return (view.in_flight + view.num_requests_waiting, view.kv_cache_usage, view.in_flight)


class LeastLoad(StatelessPolicy):
    """Power-of-two choices over `load_key`.

    Sampling two instead of scanning all keeps every gateway (and every simulated one) from
    herding onto the single least-loaded replica between two state refreshes. The RNG is
    injected so the simulator and the tests get reproducible decisions.
    """

    name = "least_load"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        if len(candidates) == 1:
            return candidates[0].replica_id
        # With exactly two candidates this compares both, in a random order, so that a full
        # tie does not always favour the first one listed.
        first, second = self._rng.sample(candidates, 2)
        return (second if load_key(second) < load_key(first) else first).replica_id
