"""Network delays of the simulated fleet: client -> gateway -> replica, and back.

Delays are one-way. The client's hop to the gateway is one fixed delay (it sits outside the
cluster; one RTT/2). A gateway -> replica hop depends on whether the replica runs on the
gateway's node (`same_node`) or on another (`cross_node`, by default the seed's 15-30 ms of
cross-node overhead, split over the request and the response: 7.5-15 ms each way). Each
request draws its two replica hops once (its stream stays on one connection, so every token
of an answer is delayed alike: ITL and TPOT do not change, TTFT and E2E do).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from servepilot.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Delay:
    """A one-way delay drawn uniformly from [low_s, high_s] (fixed when they are equal)."""

    low_s: float = 0.0
    high_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low_s) and math.isfinite(self.high_s)):
            raise ConfigError(f"network delay must be finite, got {self.low_s}-{self.high_s}")
        if not 0.0 <= self.low_s <= self.high_s:
            raise ConfigError(
                f"network delay needs 0 <= low <= high, got {self.low_s * 1e3:g}-"
                f"{self.high_s * 1e3:g} ms"
            )

    @property
    def fixed(self) -> bool:
        return self.low_s == self.high_s

    @property
    def mean_s(self) -> float:
        return (self.low_s + self.high_s) / 2


SEED_CROSS_NODE = Delay(0.0075, 0.015)
"""Seed 000: 15-30 ms cross-node overhead per request, half of it each way."""


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    client_gateway_s: float = 0.0
    """Client <-> gateway, each way (fixed)."""
    same_node: Delay = field(default_factory=Delay)
    """Gateway <-> a replica on the gateway's node, each way."""
    cross_node: Delay = SEED_CROSS_NODE
    """Gateway <-> a replica on another node, each way."""
    replicas_per_node: int = 8
    """Replica i runs on node i // replicas_per_node; the gateway runs on node 0."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.client_gateway_s) and self.client_gateway_s >= 0):
            raise ConfigError(f"client delay must be >= 0, got {self.client_gateway_s}")
        if self.replicas_per_node < 1:
            raise ConfigError(f"replicas_per_node must be >= 1, got {self.replicas_per_node}")

    def node_of(self, replica_index: int) -> int:
        return replica_index // self.replicas_per_node

    def replica_delay(self, replica_index: int) -> Delay:
        """The gateway <-> replica delay of the replica with this index."""
        return self.same_node if self.node_of(replica_index) == 0 else self.cross_node


class HopSampler:
    """Draws one hop of a `Delay` from a seeded stream (fixed delays draw nothing)."""

    __slots__ = ("_high", "_low", "_random", "_span", "fixed")

    def __init__(self, delay: Delay, rng: random.Random) -> None:
        self._low = delay.low_s
        self._high = delay.high_s
        self._span = delay.high_s - delay.low_s
        self._random = rng.random
        self.fixed = delay.fixed

    def draw(self) -> float:
        if self.fixed:
            return self._low
        # random.Random.uniform(low, high), inlined: the same float from the same draw.
        return self._low + self._span * self._random()
