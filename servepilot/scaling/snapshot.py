"""What an autoscaling policy sees, and what it answers.

Every tick the fleet simulator (and, with issue 17, the fleet's controller) hands the policy a
`FleetSnapshot` and asks how many replicas the fleet should have: `decide(snapshot, now_s) ->
ScaleDecision`, a replica count and why. More than it has: new replicas start and serve after
the cold start (`FleetSpec.cold_start_s`; the seed measured 78 s for DeepSeek-V4 from NVMe).
Fewer: the newest replicas stop taking requests and leave once their requests are done (those
still starting are cancelled first).

A policy is pure like a routing policy: it sees only the snapshot and the time, and may keep
its own small, bounded state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """One replica ready or starting, as the gateway knows it.

    `in_flight` is the gateway's own count (always current); `running`, `waiting` and
    `kv_usage` are vLLM's gauges as of the last scrape, `metrics_age_s` ago."""

    replica_id: str
    ready: bool
    """False while it is in its cold start."""
    in_flight: int
    running: int
    waiting: int
    kv_usage: float
    """0..1."""
    metrics_age_s: float
    budget: int
    """Its concurrency budget at the gateway (requests in flight at most)."""


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What an autoscaler may know about the fleet at one moment."""

    now_s: float
    replicas: tuple[ReplicaSample, ...]
    """The replicas ready or starting (not those draining)."""
    draining: int = 0
    """Replicas finishing their requests before leaving."""
    queued_by_class: tuple[int, int, int] = (0, 0, 0)
    """Requests waiting in the gateway's admission queue, P0, P1, P2."""
    arrivals_per_s: tuple[float, ...] = ()
    """Requests that reached the gateway in each of the last whole seconds, oldest first
    (bounded: `ArrivalHistory.capacity_s`); the last entry is the second that ended at
    `floor(now_s)`."""

    @property
    def ready(self) -> int:
        return sum(1 for r in self.replicas if r.ready)

    @property
    def starting(self) -> int:
        return sum(1 for r in self.replicas if not r.ready)

    @property
    def provisioned(self) -> int:
        """Replicas ready or on their way."""
        return len(self.replicas)

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    @property
    def queued(self) -> int:
        return sum(self.queued_by_class)


class ScaleReason(enum.Enum):
    """Why a policy wants the replica count it answers (a metric label: stable values)."""

    HOLD = "hold"
    """Utilisation between the lines (or nothing to do)."""
    UP = "up"
    """Utilisation above the upper line."""
    DOWN = "down"
    """Utilisation below the lower line, and the rest stay under the upper one without it."""
    COOL_DOWN = "cool_down"
    """A step is due but the last one was too recent."""
    STARTING = "starting"
    """Replicas are still starting: their effect is not visible yet."""
    REMOVAL_CHECK = "removal_check"
    """Below the lower line, but without one replica the rest would cross the upper line."""
    BOUNDS = "bounds"
    """Pushed back inside [min, max]."""
    FORECAST = "forecast"
    """The forecast load needs more replicas than the rules."""
    TARGET = "target"
    """The share of concurrency budgets in use (the HPA-like baseline)."""
    TOO_FEW = "too_few"
    """A step down held: the count it would leave was too few for this load before
    (`scaling.flap`)."""


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    """Replicas (ready or starting) the fleet should have."""
    reason: ScaleReason
    detail: str = ""
    """The numbers behind it, for a log line."""


class AutoscalePolicy(Protocol):
    name: str

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        """The replicas the fleet should have, and why."""
        ...
