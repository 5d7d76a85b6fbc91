"""Routing policies: pure choices of a replica for a request (see `routing.base`)."""

from __future__ import annotations

import random
from collections.abc import Callable

from servepilot.core.config import PolicyName, RoutingConfig
from servepilot.core.errors import ConfigError
from servepilot.routing.base import ReplicaView, RequestView, RoutingPolicy
from servepilot.routing.hybrid import Hybrid
from servepilot.routing.kv_index import KvIndex
from servepilot.routing.least_load import LeastLoad
from servepilot.routing.length_shard import LengthShard
from servepilot.routing.predicted import PredictedLatency, PrefixIndex, StepTimeModel
from servepilot.routing.prefix import prefix_hashes, prompt_text
from servepilot.routing.prefix_affinity import PrefixAffinity
from servepilot.routing.round_robin import RoundRobin
from servepilot.routing.session import SessionAffinity

__all__ = [
    "Hybrid",
    "LeastLoad",
    "LengthShard",
    "PredictedLatency",
    "PrefixAffinity",
    "PrefixIndex",
    "ReplicaView",
    "RequestView",
    "RoundRobin",
    "RoutingPolicy",
    "SessionAffinity",
    "StepTimeModel",
    "make_policy",
    "prefix_hashes",
    "prompt_text",
]


def make_policy(
    name: PolicyName,
    config: RoutingConfig | None = None,
    seed: int | None = None,
    *,
    clock: Callable[[], float] | None = None,
    step_model: Callable[[str], StepTimeModel] | None = None,
    index: PrefixIndex | None = None,
    kv_index: KvIndex | None = None,
) -> RoutingPolicy:
    """The policy called `name`, tuned by `config` (defaults when None).

    `seed` fixes the random choices of randomised policies; pass it by keyword.
    predicted_latency also needs the `clock` its caller's request times come from and each
    replica's `step_model`; `index` (else the gateway's guess) says what each one caches.
    `kv_index`: the exact index the prefix-aware policies consult for replicas whose KV
    events flow.
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
    if policy is PolicyName.PREDICTED_LATENCY:
        if clock is None or step_model is None:
            raise ConfigError(
                "the predicted_latency policy needs each replica's step-time model",
                hint="run it under `servepilot up` or `servepilot sim`, which derive it from "
                "the fleet's profile (gateway.routing.step_profile) or its roofline",
            )
        return PredictedLatency(knobs, rng, clock, step_model, index, kv_index)
    return Hybrid(knobs, rng, kv_index)
