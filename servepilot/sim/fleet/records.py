"""The fleet simulator's inputs and outputs: the fleet, and what a level produced."""

from __future__ import annotations

from dataclasses import dataclass, field

from servepilot.core.config import GatewayConfig
from servepilot.core.errors import ConfigError
from servepilot.core.results import Run
from servepilot.plan.costmodel import CostModel
from servepilot.sim.engine.records import SchedulerConfig
from servepilot.sim.fleet.network import NetworkConfig


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The simulated fleet: identical replicas behind one gateway."""

    scheduler: SchedulerConfig
    cost: CostModel
    replicas: int
    capacity: int
    """A replica's concurrency budget at the gateway."""
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    scrape_interval_s: float | None = None
    """How often vLLM's gauges are read; None: gateway.health_interval_s."""
    cold_start_s: float = 0.0
    """From launching a replica to its engine serving."""
    start_cold: bool = False
    """The first replicas start cold too (else they are ready at time 0)."""
    autoscale_interval_s: float = 15.0
    seed: int = 0
    model_name: str = "sim"

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.capacity < 1:
            raise ConfigError("the fleet needs replicas >= 0 and a capacity >= 1")
        if self.cold_start_s < 0 or self.autoscale_interval_s <= 0:
            raise ConfigError("cold_start_s must be >= 0 and autoscale_interval_s > 0")
        if self.scrape_interval_s is not None and self.scrape_interval_s <= 0:
            raise ConfigError("scrape_interval_s must be > 0")


@dataclass(frozen=True, slots=True)
class FleetStats:
    """What the fleet did during a level, beyond the client's metrics."""

    sim_s: float
    steps: int
    preemptions: int
    prefix_hit_rate: float
    """Prefix-cache hit tokens / looked-up tokens over every replica."""
    replicas_peak: int
    replicas_end: int
    shed: dict[str, int]
    queued: int
    events: int
    wall_s: float
    cpu_s: float
    replica_s: float = 0.0
    """Replica time paid for, every replica from its launch (cold start included) to its stop
    or the end of the level."""
    scale_events: int | None = None
    """Decisions that changed the number of replicas; None without an autoscaler."""


@dataclass(frozen=True, slots=True)
class LevelOutcome:
    run: Run
    stats: FleetStats


@dataclass(frozen=True, slots=True)
class Progress:
    sim_s: float
    completed: int
    failed: int
