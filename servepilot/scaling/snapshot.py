"""What an autoscaling policy sees, and what it answers.

Every `interval_s` the fleet simulator (and, with issue 17, the fleet's controller) hands the
policy a `FleetSnapshot` and asks how many replicas the fleet should have (`decide(snapshot,
now_s) -> int`). More than it has: new replicas start and serve after the cold start
(`FleetSpec.cold_start_s`; the seed measured 78 s for DeepSeek-V4 from NVMe). Fewer: the newest
replicas stop taking requests and leave once their requests are done (those still starting are
cancelled first).

A policy is pure like a routing policy: it sees only the snapshot and the time, and may keep
its own small state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What an autoscaler may know about the fleet at one moment."""

    now_s: float
    ready: int
    """Replicas taking requests."""
    starting: int
    """Replicas in their cold start."""
    draining: int
    """Replicas finishing their requests before leaving."""
    in_flight: int
    """Requests the gateway has on replicas."""
    queued: int
    """Requests waiting in the gateway's admission queue."""
    vllm_waiting: int
    """Requests waiting inside the replicas (vLLM's gauge at the last scrape)."""
    mean_kv_usage: float
    """Mean KV cache usage of the ready replicas at the last scrape, 0..1."""
    capacity_per_replica: int
    """A replica's concurrency budget."""
    dispatch_rate_per_s: float
    """Requests sent to replicas per second, recently."""

    @property
    def provisioned(self) -> int:
        """Replicas ready or on their way."""
        return self.ready + self.starting


class AutoscalePolicy(Protocol):
    name: str

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> int:
        """The number of replicas (ready or starting) the fleet should have."""
        ...
