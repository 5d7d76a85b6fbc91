"""The routing package's frozen records, as the simulator builds them: per request, fast.

Kept apart from the compiled modules (accel.py): `LiveView` subclasses the routing package's
interpreted `ReplicaView`, which a mypyc-compiled class cannot.

A frozen dataclass's __init__ sets each field through object.__setattr__, by name: building a
`RequestView` costs more than the routing decision it feeds. The simulator fills the same
slots through their descriptors, `*_SETTERS` here, in field order (the same objects, field
for field; tests compare them with the dataclasses' own constructors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servepilot.routing.base import ReplicaView, RequestView


class LiveView(ReplicaView):
    """A `ReplicaView` the simulated gateway updates in place as the replica's state changes.

    The gateway builds fresh frozen views per request; at millions of requests that costs
    more than all the rest of a routing decision, so the simulator keeps one per replica.
    Policies read views only while choosing (none keeps one), so they see the same values."""

    __slots__ = ()

    def set_in_flight(self, in_flight: int) -> None:
        _set(self, "in_flight", in_flight)

    def set_capacity(self, capacity: int) -> None:
        _set(self, "capacity", capacity)

    def set_gauges(self, running: int, waiting: int, kv_usage: float) -> None:
        _set(self, "num_requests_running", running)
        _set(self, "num_requests_waiting", waiting)
        _set(self, "kv_cache_usage", kv_usage)


_set = object.__setattr__  # past the frozen dataclass's guard


def _setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    fields = tuple(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    assert fields == names, f"{cls.__name__}'s fields changed: {fields}"
    return tuple(vars(cls)[name].__set__ for name in names)


SET_IN_FLIGHT = vars(ReplicaView)["in_flight"].__set__
"""`LiveView.set_in_flight` without the method call."""
REQUEST_VIEW_SETTERS = _setters(
    RequestView,
    ("model", "prompt_chars", "prompt_tokens", "prefix_hashes", "session_id", "priority",
     "arrival_s", "kv_block_hashes"),
)  # fmt: skip
