"""Utilisation, defined once: what every rule of `scaling/` compares with its lines."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.scaling.snapshot import FleetSnapshot, ReplicaSample


@dataclass(frozen=True, slots=True)
class UtilisationLimits:
    """What counts as a full replica."""

    queue_threshold: int = 5
    """Requests waiting inside vLLM that make a replica full (llm-d's saturation: 5)."""
    kv_full: float = 0.8
    """KV cache usage that makes a replica full (llm-d's: 0.8)."""
    stale_after_s: float = 30.0
    """Gauges older than this make a replica count as full: an autoscaler that cannot see a
    replica must not conclude it is idle."""

    def __post_init__(self) -> None:
        if self.queue_threshold < 1 or not 0.0 < self.kv_full <= 1.0:
            raise ConfigError("utilisation needs queue_threshold >= 1 and kv_full in (0, 1]")
        if self.stale_after_s <= 0:
            raise ConfigError("stale_after_s must be > 0")


def replica_utilisation(replica: ReplicaSample, limits: UtilisationLimits) -> float:
    """How full one ready replica is: 1.0 is full.

        max(in flight / concurrency budget,
            vLLM waiting / queue_threshold,
            KV cache usage / kv_full)

    and 1.0 when its gauges are older than `stale_after_s`. Each term is a way to be full:
    the gateway's budget used up, requests queueing inside vLLM, the KV cache nearly
    exhausted (vLLM preempts beyond it). A term may exceed 1.0 (a replica can be more than
    full); the fleet's utilisation is the mean over the ready replicas (`fleet_utilisation`)
    and the step rules read its peak over the last minute (`PeakWindow`)."""
    if replica.metrics_age_s > limits.stale_after_s:
        return 1.0
    return max(
        replica.in_flight / max(1, replica.budget),
        replica.waiting / limits.queue_threshold,
        replica.kv_usage / limits.kv_full,
    )


def fleet_utilisation(snapshot: FleetSnapshot, limits: UtilisationLimits) -> float:
    """The mean of the ready replicas' `replica_utilisation`. With none ready, 1.0 when
    requests wait at the gateway (a fleet scaled to zero is full once anyone asks), else 0.0."""
    total, ready = 0.0, 0
    for replica in snapshot.replicas:
        if replica.ready:
            total += replica_utilisation(replica, limits)
            ready += 1
    if not ready:
        return 1.0 if snapshot.queued else 0.0
    return total / ready


class PeakWindow:
    """The highest of the values seen over the last `window_s` (a monotonic deque: O(1)
    amortised per value, bounded by the values in the window)."""

    def __init__(self, window_s: float = 60.0) -> None:
        if window_s < 0:
            raise ConfigError(f"the peak window must be >= 0 s, got {window_s}")
        self.window_s = window_s
        self._values: deque[tuple[float, float]] = deque()

    def add(self, now_s: float, value: float) -> float:
        """Record `value` at `now_s`; the peak of the window ending at `now_s`."""
        values = self._values
        while values and values[-1][1] <= value:
            values.pop()
        values.append((now_s, value))
        while values[0][0] < now_s - self.window_s:
            values.popleft()
        return values[0][1]

    def clear(self) -> None:
        self._values.clear()
