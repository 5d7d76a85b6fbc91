"""The routing-policy contract: a pure choice over a snapshot of replica state.

A policy never does I/O and never reads the clock itself: the gateway feeds it live state
scraped from the replicas, the simulator feeds it simulated state, and the same class runs in
both. A policy may keep its own small state (a round-robin cursor, a seeded RNG), which makes
its decisions a function of (that state, the request, the snapshot).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a policy may know about one routable replica at the moment of the decision."""

    replica_id: str
    in_flight: int
    """Requests the gateway has sent to this replica and not yet seen finish."""
    num_requests_running: int = 0
    """`vllm:num_requests_running` from the last scrape."""
    num_requests_waiting: int = 0
    """`vllm:num_requests_waiting` from the last scrape."""
    kv_cache_usage: float = 0.0
    """`vllm:kv_cache_usage_perc` from the last scrape, 0..1."""


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may know about the request being routed."""

    model: str
    prompt_chars: int = 0
    session_id: str | None = None


class RoutingPolicy(Protocol):
    """Chooses one replica among the candidates (never empty; the caller checks)."""

    name: str

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        """Return the `replica_id` of the chosen candidate."""
        ...
