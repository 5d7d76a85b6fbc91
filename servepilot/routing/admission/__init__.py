"""Admission control and protection: pure decision objects the gateway and the simulator share.

Nothing here does I/O, reads the clock (time comes in as `now_s`) or draws randomness other
than from an injected `random.Random`:

- `queue`: the per-class admission queue with aging and queue budgets;
- `fair`: tenants' weighted fair shares inside a class (deficit round robin);
- `decision`: dispatch, queue or refuse an arriving request;
- `meter`: the dispatch rate the decision predicts queue waits from;
- `breaker`: per-replica circuit breakers;
- `limits`: the hard limit (slow first bytes) and soft limit (graceful degradation);
- `ratelimit`: per-API-key token buckets;
- `driver`: the cycle over them (arrive, release, pump, tick) that gateway and simulator run.
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
from servepilot.routing.admission.driver import (
    BUSY_TICK_S,
    IDLE_TICK_S,
    AdmissionDriver,
    FleetLoad,
    Slots,
    TickReport,
)
from servepilot.routing.admission.limits import (
    DegradationEvent,
    DegradationLevel,
    HardLimit,
    SoftLimit,
)
from servepilot.routing.admission.meter import RateMeter
from servepilot.routing.admission.queue import SHARED_TENANT, AdmissionQueue, Ticket
from servepilot.routing.admission.ratelimit import KeyLimiter, TokenBucket

__all__ = [
    "BUSY_TICK_S",
    "IDLE_TICK_S",
    "SHARED_TENANT",
    "Admission",
    "AdmissionController",
    "AdmissionDriver",
    "AdmissionQueue",
    "AdmissionSnapshot",
    "AdmitKind",
    "BreakerBoard",
    "BreakerState",
    "BreakerTransition",
    "CircuitBreaker",
    "DegradationEvent",
    "DegradationLevel",
    "FleetLoad",
    "HardLimit",
    "KeyLimiter",
    "RateMeter",
    "Reason",
    "Slots",
    "SoftLimit",
    "TickReport",
    "Ticket",
    "TokenBucket",
    "free_slots",
]
