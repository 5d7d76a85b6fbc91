"""Protection limits: the hard limit (slow first bytes) and the soft limit (sustained saturation).

Both only keep state and answer questions; the gateway feeds them observations and turns
their answers into admission decisions (`admission.decision`).
"""

from __future__ import annotations

import enum
import statistics
from collections import deque
from dataclasses import dataclass

from servepilot.core.config import ProtectionConfig


class HardLimit:
    """Sheds a share of the lowest class while a replica's first bytes come too slowly.

    Each replica keeps a sliding window of its last `window` upstream times to first byte.
    The limit is crossed when ANY replica's window median is above the threshold, not when
    the fleet's median is: that is how the configuration defines it ("when a replica's ...
    passes this"), and the router keeps sending a slow replica its share of traffic, so one
    slow replica already hurts the requests routed to it; a fleet median would hide it until
    half the fleet is slow. The reaction is mild (a few percent of P2), so a single outlier
    replica crossing costs little.
    """

    def __init__(
        self,
        ttfb_threshold_ms: float,
        shed_share: float,
        window: int = 64,
        min_samples: int = 8,
    ) -> None:
        if ttfb_threshold_ms <= 0 or not 0.0 <= shed_share <= 1.0:
            raise ValueError("need ttfb_threshold_ms > 0 and 0 <= shed_share <= 1")
        if window < 1 or not 1 <= min_samples <= window:
            raise ValueError("need window >= 1 and 1 <= min_samples <= window")
        self.ttfb_threshold_ms = ttfb_threshold_ms
        self.shed_share = shed_share
        self._window = window
        # A replica's first requests are slow for reasons that pass (graph capture, empty
        # prefix cache): judging it on one or two of them would shed traffic for nothing.
        self._min_samples = min_samples
        self._samples: dict[str, deque[float]] = {}
        self._medians: dict[str, float] = {}
        """Cached window medians, dropped when a new sample arrives."""

    @classmethod
    def from_config(cls, config: ProtectionConfig, window: int = 64) -> HardLimit:
        return cls(config.hard_limit_ttfb_ms, config.hard_limit_shed_share, window)

    def observe(self, replica_id: str, ttfb_ms: float) -> None:
        """One upstream time to first byte of `replica_id`, in milliseconds."""
        samples = self._samples.get(replica_id)
        if samples is None:
            samples = self._samples[replica_id] = deque(maxlen=self._window)
        samples.append(ttfb_ms)
        self._medians.pop(replica_id, None)

    def forget(self, replica_id: str) -> None:
        """The replica left the pool (or is no longer ready): stop judging by it."""
        self._samples.pop(replica_id, None)
        self._medians.pop(replica_id, None)

    def tracked(self) -> set[str]:
        """The replicas the limit currently judges."""
        return set(self._samples)

    def median_ms(self, replica_id: str) -> float | None:
        """The replica's window median; None until it has `min_samples` samples."""
        samples = self._samples.get(replica_id)
        if samples is None or len(samples) < self._min_samples:
            return None
        median = self._medians.get(replica_id)
        if median is None:
            median = self._medians[replica_id] = float(statistics.median(samples))
        return median

    def crossed(self) -> bool:
        """Whether any tracked replica's median is above the threshold."""
        for replica_id in self._samples:
            median = self.median_ms(replica_id)
            if median is not None and median > self.ttfb_threshold_ms:
                return True
        return False

    def current_shed_share(self) -> float:
        """The share of lowest-class requests to shed now (0.0 while not crossed)."""
        return self.shed_share if self.crossed() else 0.0


class DegradationLevel(enum.IntEnum):
    """Graceful degradation steps, each including the ones below it."""

    NORMAL = 0
    SHED_BATCH = 1
    """P2 requests are refused with 429."""
    CAP_TOKENS = 2
    """In addition, P1 requests get their max_tokens capped."""


@dataclass(frozen=True, slots=True)
class DegradationEvent:
    """A change of degradation level, for the gateway's log and counters."""

    at_s: float
    """When the level changed: the moment saturation (or calm) had lasted sustain_s, which
    is earlier than the update that noticed it if updates are sparse."""
    from_level: DegradationLevel
    to_level: DegradationLevel
    reason: str
    """What was saturated ("kv_usage", "queue_depth" or both, comma separated) when stepping
    up; "recovered" when stepping down."""


class SoftLimit:
    """Steps degradation up under sustained saturation and back down when it is over.

    Saturated means mean KV cache usage >= `kv_usage_threshold`, or queued requests per ready
    replica >= `queue_per_replica`. Each `sustain_s` of uninterrupted saturation raises the
    level one step; each `sustain_s` without it lowers it one step. With no ready replica the
    queue criterion is off: requests queued during a cold start say nothing about load, and
    the cold-start wait has its own timeout.
    """

    def __init__(self, kv_usage_threshold: float, queue_per_replica: float, sustain_s: float):
        if sustain_s <= 0 or queue_per_replica <= 0:
            raise ValueError("need sustain_s > 0 and queue_per_replica > 0")
        self._kv_threshold = kv_usage_threshold
        self._queue_per_replica = queue_per_replica
        self._sustain_s = sustain_s
        self._level = DegradationLevel.NORMAL
        self._saturated: bool | None = None
        self._since_s = 0.0
        """Start of the current run of (non-)saturation, or of the last step taken in it."""

    @classmethod
    def from_config(cls, config: ProtectionConfig) -> SoftLimit:
        return cls(
            config.soft_limit_kv_usage,
            config.soft_limit_queue_per_replica,
            config.soft_limit_sustain_s,
        )

    @property
    def level(self) -> DegradationLevel:
        return self._level

    def update(
        self, now_s: float, mean_kv_usage: float, queued_total: int, ready_replicas: int
    ) -> list[DegradationEvent]:
        """Feed the current fleet state; returns the level changes it caused (often none)."""
        causes = self._causes(mean_kv_usage, queued_total, ready_replicas)
        saturated = bool(causes)
        if saturated != self._saturated:
            self._saturated = saturated
            self._since_s = now_s
        events: list[DegradationEvent] = []
        while now_s - self._since_s >= self._sustain_s:
            step = 1 if saturated else -1
            target = self._level + step
            if not DegradationLevel.NORMAL <= target <= DegradationLevel.CAP_TOKENS:
                break
            self._since_s += self._sustain_s
            new_level = DegradationLevel(target)
            reason = ",".join(causes) if saturated else "recovered"
            events.append(DegradationEvent(self._since_s, self._level, new_level, reason))
            self._level = new_level
        return events

    def _causes(self, mean_kv_usage: float, queued_total: int, ready_replicas: int) -> list[str]:
        causes: list[str] = []
        if mean_kv_usage >= self._kv_threshold:
            causes.append("kv_usage")
        if ready_replicas > 0 and queued_total / ready_replicas >= self._queue_per_replica:
            causes.append("queue_depth")
        return causes
