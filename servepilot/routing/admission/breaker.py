"""Per-replica circuit breakers: stop sending to a replica that keeps failing, probe it later."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from servepilot.core.config import ProtectionConfig

# Transitions kept for the caller to drain; older ones are dropped (the counter still counts
# them) so that a caller that never drains does not grow memory.
_EVENTS_KEPT = 256


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    """Requests flow."""
    OPEN = "open"
    """No request is sent until `open_s` has passed."""
    HALF_OPEN = "half_open"
    """One probe request is in flight; its outcome closes or re-opens the breaker."""


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    name: str
    """The breaker's name (the replica id on a `BreakerBoard`)."""
    at_s: float
    from_state: BreakerState
    to_state: BreakerState


class CircuitBreaker:
    """Opens after `failures_to_open` consecutive failures, half-opens after `open_s`.

    Outcomes are not tied to the request that was allowed: a success reported while half-open
    closes the breaker even if it came from a request sent before it opened (the replica did
    answer). Outcomes reported while open are ignored: they come from requests sent before it
    opened, and must neither close it nor extend the open period.
    """

    def __init__(self, failures_to_open: int, open_s: float, name: str = "") -> None:
        if failures_to_open < 1 or open_s <= 0:
            raise ValueError("need failures_to_open >= 1 and open_s > 0")
        self.name = name
        self._failures_to_open = failures_to_open
        self._open_s = open_s
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_s = 0.0
        self._probe_in_flight = False
        self._transitions = 0
        self._events: deque[BreakerTransition] = deque(maxlen=_EVENTS_KEPT)

    @property
    def state(self) -> BreakerState:
        """The state as of the last call (an OPEN breaker past `open_s` shows OPEN until
        `allow` lets its probe through)."""
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def transitions(self) -> int:
        """State changes since creation (a counter for the metrics)."""
        return self._transitions

    def would_allow(self, now_s: float) -> bool:
        """Whether `allow` would say yes, without claiming the probe.

        For filtering routing candidates: calling `allow` on every candidate would hand the
        half-open probe to replicas the policy then does not choose.
        """
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            return now_s - self._opened_s >= self._open_s
        return not self._probe_in_flight

    def allow(self, now_s: float) -> bool:
        """Whether a request may be sent now; in half-open, the yes claims the single probe."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            if now_s - self._opened_s < self._open_s:
                return False
            self._move(BreakerState.HALF_OPEN, now_s)
        if self._probe_in_flight:
            return False
        self._probe_in_flight = True
        return True

    def record_success(self, now_s: float) -> None:
        if self._state is BreakerState.OPEN:
            return
        self._failures = 0
        if self._state is BreakerState.HALF_OPEN:
            self._probe_in_flight = False
            self._move(BreakerState.CLOSED, now_s)

    def record_failure(self, now_s: float) -> None:
        """An error or timeout of a request to the replica."""
        if self._state is BreakerState.OPEN:
            return
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN or self._failures >= self._failures_to_open:
            self._probe_in_flight = False
            self._opened_s = now_s
            self._move(BreakerState.OPEN, now_s)

    def record_abandoned(self, now_s: float) -> None:
        """An allowed request ended with no verdict (e.g. its client left first).

        In half-open this frees the probe slot so that the next `allow` sends another probe;
        otherwise the breaker would wait forever for an outcome that never comes.
        """
        if self._state is BreakerState.HALF_OPEN:
            self._probe_in_flight = False

    def drain_events(self) -> list[BreakerTransition]:
        """The transitions since the last call (at most the last 256), oldest first."""
        events = list(self._events)
        self._events.clear()
        return events

    def _move(self, to_state: BreakerState, now_s: float) -> None:
        self._events.append(BreakerTransition(self.name, now_s, self._state, to_state))
        self._transitions += 1
        self._state = to_state


class BreakerBoard:
    """One breaker per replica id, created on first use and dropped by `forget`."""

    def __init__(self, failures_to_open: int, open_s: float) -> None:
        # Built once to check the arguments now rather than at the first replica.
        CircuitBreaker(failures_to_open, open_s)
        self._failures_to_open = failures_to_open
        self._open_s = open_s
        self._breakers: dict[str, CircuitBreaker] = {}

    @classmethod
    def from_config(cls, config: ProtectionConfig) -> BreakerBoard:
        return cls(config.breaker_failures, config.breaker_open_s)

    def get(self, replica_id: str) -> CircuitBreaker:
        breaker = self._breakers.get(replica_id)
        if breaker is None:
            breaker = CircuitBreaker(self._failures_to_open, self._open_s, name=replica_id)
            self._breakers[replica_id] = breaker
        return breaker

    def would_allow(self, replica_id: str, now_s: float) -> bool:
        breaker = self._breakers.get(replica_id)
        return breaker is None or breaker.would_allow(now_s)

    def allow(self, replica_id: str, now_s: float) -> bool:
        return self.get(replica_id).allow(now_s)

    def record_success(self, replica_id: str, now_s: float) -> None:
        self.get(replica_id).record_success(now_s)

    def record_failure(self, replica_id: str, now_s: float) -> None:
        self.get(replica_id).record_failure(now_s)

    def record_abandoned(self, replica_id: str, now_s: float) -> None:
        breaker = self._breakers.get(replica_id)
        if breaker is not None:
            breaker.record_abandoned(now_s)

    def forget(self, replica_id: str) -> None:
        self._breakers.pop(replica_id, None)

    def states(self) -> Mapping[str, BreakerState]:
        return {rid: breaker.state for rid, breaker in self._breakers.items()}

    def drain_events(self) -> list[BreakerTransition]:
        """Every breaker's transitions since the last call, in time order."""
        events = [e for b in self._breakers.values() for e in b.drain_events()]
        events.sort(key=lambda event: event.at_s)
        return events
