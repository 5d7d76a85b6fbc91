"""Admission control and protection: pure decision objects the gateway and the simulator share.

Nothing here does I/O, reads the clock (time comes in as `now_s`) or draws randomness other
than from an injected `random.Random`:

- `queue`: the per-class admission queue with aging and queue budgets;
- `decision`: dispatch, queue or refuse an arriving request;
- `meter`: the dispatch rate the decision predicts queue waits from;
- `breaker`: per-replica circuit breakers;
- `limits`: the hard limit (slow first bytes) and soft limit (graceful degradation);
- `ratelimit`: per-API-key token buckets.
"""

from __future__ import annotations

from servepilot.routing.admission.breaker import (
    BreakerBoard,
    BreakerState,
    BreakerTransition,
    CircuitBreaker,
)
from servepilot.routing.admission.decision import (
    Admission,
    AdmissionController,
    AdmissionSnapshot,
    AdmitKind,
    Reason,
    free_slots,
)
from servepilot.routing.admission.limits import (
    DegradationEvent,
    DegradationLevel,
    HardLimit,
    SoftLimit,
)
from servepilot.routing.admission.meter import RateMeter
from servepilot.routing.admission.queue import AdmissionQueue, Ticket
from servepilot.routing.admission.ratelimit import KeyLimiter, TokenBucket

__all__ = [
    "Admission",
    "AdmissionController",
    "AdmissionQueue",
    "AdmissionSnapshot",
    "AdmitKind",
    "BreakerBoard",
    "BreakerState",
    "BreakerTransition",
    "CircuitBreaker",
    "DegradationEvent",
    "DegradationLevel",
    "HardLimit",
    "KeyLimiter",
    "RateMeter",
    "Reason",
    "SoftLimit",
    "Ticket",
    "TokenBucket",
    "free_slots",
]
