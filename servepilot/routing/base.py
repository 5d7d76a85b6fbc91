"""The routing-policy contract: a pure choice over a snapshot of replica state.

A policy never does I/O and never reads the clock itself: the gateway feeds it live state
scraped from the replicas, the simulator feeds it simulated state, and the same class runs in
both. A policy may keep its own small state (a round-robin cursor, a seeded RNG, a bounded
prefix table), which makes its decisions a function of (that state, the request, the
snapshot). Time reaches it only as `RequestView.arrival_s`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from servepilot.core.config import Priority


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
    capacity: int = 256
    """The replica's concurrency budget: requests in flight it is given at most."""
    group: str | None = None
    """A group label given when the replica was registered (`short` / `long` for
    length_shard); None lets the policy place it."""


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may know about the request being routed."""

    model: str
    prompt_chars: int = 0
    prompt_tokens: int = 0
    """Estimated prompt tokens (the gateway does not tokenize)."""
    prefix_hashes: tuple[int, ...] = ()
    """Chained hashes of the prompt's leading blocks (see `routing.prefix`); filled only for
    policies whose `uses_prefix` is true."""
    session_id: str | None = None
    priority: int = Priority.P1
    arrival_s: float = 0.0
    """The gateway's (or the simulator's) clock when the request arrived."""
    kv_block_hashes: tuple[bytes | int, ...] = ()
    """The prompt's block hashes as vLLM computes them (`routing.kv_index`), for the exact
    index; filled only when the gateway tokenises prompts (the simulator's are ints,
    sim/fleet/kvevents.py)."""


class RoutingPolicy(Protocol):
    """Chooses one replica among the candidates (never empty; the caller checks)."""

    name: str
    uses_prefix: bool
    """Whether the caller must fill `RequestView.prefix_hashes` (hashing is not free)."""

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        """Return the `replica_id` of the chosen candidate."""
        ...

    def forget(self, replica_id: str) -> None:
        """The replica left the pool: drop whatever the policy remembers about it."""
        ...

    def stats(self) -> Mapping[str, float]:
        """Counters the gateway exports (e.g. prefix blocks looked up and matched)."""
        ...


class StatelessPolicy:
    """Defaults for policies that remember nothing per replica and export nothing."""

    uses_prefix = False

    def forget(self, replica_id: str) -> None:
        return None

    def stats(self) -> Mapping[str, float]:
        return {}
