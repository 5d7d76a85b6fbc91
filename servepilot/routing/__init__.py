"""Routing policies: pure choices of a replica for a request (see `routing.base`)."""

from __future__ import annotations

import random

from servepilot.core.config import PolicyName, RoutingConfig
from servepilot.routing.base import ReplicaView, RequestView, RoutingPolicy
from servepilot.routing.hybrid import Hybrid
from servepilot.routing.kv_index import KvIndex
from servepilot.routing.least_load import LeastLoad
from servepilot.routing.length_shard import LengthShard
from servepilot.routing.prefix import prefix_hashes, prompt_text
from servepilot.routing.prefix_affinity import PrefixAffinity
from servepilot.routing.round_robin import RoundRobin
from servepilot.routing.session import SessionAffinity

__all__ = [
    "Hybrid",
    "LeastLoad",
    "LengthShard",
    "PrefixAffinity",
    "ReplicaView",
    "RequestView",
    "RoundRobin",
    "RoutingPolicy",
    "SessionAffinity",
    "make_policy",
    "prefix_hashes",
    "prompt_text",
]


def make_policy(
    name: PolicyName,
    config: RoutingConfig | None = None,
    seed: int | None = None,
    *,
    kv_index: KvIndex | None = None,
) -> RoutingPolicy:
    """The policy called `name`, tuned by `config` (defaults when None).

    `seed` fixes the random choices of randomised policies; pass it by keyword. `kv_index`:
    the exact index the prefix-aware policies consult for replicas whose KV events flow.
    """
    # PolicyName() also accepts the plain string, and refuses an unknown one with ValueError.
    policy = PolicyName(name)
    knobs = config if config is not None else RoutingConfig()
    rng = random.Random(seed)
    if policy is PolicyName.ROUND_ROBIN:
        return RoundRobin()
    if policy is PolicyName.LEAST_LOAD:
        return LeastLoad(rng)
    if policy is PolicyName.PREFIX_AFFINITY:
        return PrefixAffinity(knobs, rng, kv_index=kv_index)
    if policy is PolicyName.SESSION:
        return SessionAffinity(knobs, rng)
    if policy is PolicyName.LENGTH_SHARD:
        return LengthShard(knobs, rng)
    return Hybrid(knobs, rng, kv_index)
