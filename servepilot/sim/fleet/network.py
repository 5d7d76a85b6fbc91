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


def parse_network(text: str | None, replicas_per_node: int, client_s: float = 0.0) -> NetworkConfig:
    """`client=1,same=0.05,cross=7.5-15` (one-way ms, the --network-ms flag) ->
    NetworkConfig; `client_s` is the client's delay when the text does not give one."""
    delays: dict[str, Delay] = {
        "client": Delay(client_s, client_s),
        "same": Delay(),
        "cross": SEED_CROSS_NODE,
    }
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in delays:
            raise ConfigError(
                f"--network-ms {text!r}: {part!r} is not KEY=MS with KEY one of client, same, cross"
            )
        delays[key] = _delay(value, text or "")
    client = delays["client"]
    if not client.fixed:
        raise ConfigError(f"--network-ms {text!r}: the client's delay is one value, not a range")
    return NetworkConfig(
        client_gateway_s=client.low_s,
        same_node=delays["same"],
        cross_node=delays["cross"],
        replicas_per_node=replicas_per_node,
    )


def _delay(value: str, text: str) -> Delay:
    low, _, high = value.strip().partition("-")
    try:
        lo_ms = float(low)
        hi_ms = float(high) if high else lo_ms
    except ValueError:
        raise ConfigError(f"--network-ms {text!r}: {value!r} is not MS or LOW-HIGH") from None
    if not (math.isfinite(lo_ms) and math.isfinite(hi_ms)) or not 0 <= lo_ms <= hi_ms:
        raise ConfigError(f"--network-ms {text!r}: {value!r} needs 0 <= LOW <= HIGH")
    return Delay(lo_ms / 1000.0, hi_ms / 1000.0)
