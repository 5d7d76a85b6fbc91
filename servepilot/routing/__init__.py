"""Routing policies: pure choices of a replica for a request (see `routing.base`)."""

from __future__ import annotations

import random

from servepilot.core.config import PolicyName
from servepilot.routing.base import ReplicaView, RequestView, RoutingPolicy
from servepilot.routing.least_load import LeastLoad
from servepilot.routing.round_robin import RoundRobin

__all__ = [
    "LeastLoad",
    "ReplicaView",
    "RequestView",
    "RoundRobin",
    "RoutingPolicy",
    "make_policy",
]


def make_policy(name: PolicyName, seed: int | None = None) -> RoutingPolicy:
    """The policy called `name`; `seed` fixes the random choices of randomised policies."""
    # PolicyName() also accepts the plain string, and refuses an unknown one with ValueError.
    policy = PolicyName(name)
    if policy is PolicyName.ROUND_ROBIN:
        return RoundRobin()
    return LeastLoad(random.Random(seed))
