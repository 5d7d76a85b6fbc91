"""The fleet simulator's inputs and outputs: the fleet, and what a level produced."""

from __future__ import annotations

from dataclasses import dataclass, field

from servepilot.core.config import GatewayConfig
from servepilot.core.errors import ConfigError
from servepilot.core.results import Run
from servepilot.plan.costmodel import CostModel
from servepilot.scaling.warm_pool import WAKE_S
from servepilot.sim.engine.records import SchedulerConfig
from servepilot.sim.fleet.network import NetworkConfig

SLEEP_S = 11.6
"""Its first sleep in the same run (11.56 s; later ones 0.41-0.43 s): a replica entering the
pool pays the first."""


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
    warm_pool: int = 0
    """Replicas the autoscaler keeps asleep behind the serving ones (0: none)."""
    wake_s: float = WAKE_S
    """From waking a sleeping replica to its engine serving."""
    sleep_s: float = SLEEP_S
    """From a drained replica's sleep call to its GPU memory freed (held, paid, till then)."""
    cold_refill: bool = True
    """The pool is refilled by cold starts after each wake (else only by replicas given back:
    `scaling.warm_pool.plan_pool`)."""
    kv_events: bool = False
    """The replicas publish their KV events and the gateway keeps the exact index of their
    prefix caches from them (fleet.yaml's engine.kv_events; sim/fleet/kvevents.py), read by
    the prefix-aware policies. False: they guess from what they sent where."""
    kv_events_delay_s: float | None = None
    """From the end of the step that stored or evicted blocks to its events applied at the
    gateway; None: the replica's one-way network hop (its mean)."""
    intake_s_per_prompt_token: float = 0.0
    """vLLM's API server time per prompt token before its engine sees a request (tokenising
    the text, the hand-off), one request at a time per replica, after the gateway's hop to
    it; from the profile's meta (`intake_us_per_prompt_token`)."""
    output_s_per_token: float = 0.0
    """vLLM's API server time per token it streams (detokenising, the server-sent event),
    one step after another in a queue of its own (`FleetReplica.stream`); from the
    profile's meta (`output_us_per_token`)."""
    gateways: int = 1
    """Gateway pods behind a load balancer that deals them requests in turn, each routing
    with its own policy object (sim/fleet/gateways.py); 1: one gateway."""
    seed: int = 0
    model_name: str = "sim"

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.capacity < 1:
            raise ConfigError("the fleet needs replicas >= 0 and a capacity >= 1")
        if self.cold_start_s < 0 or self.autoscale_interval_s <= 0:
            raise ConfigError("cold_start_s must be >= 0 and autoscale_interval_s > 0")
        if self.warm_pool < 0 or self.wake_s < 0 or self.sleep_s < 0:
            raise ConfigError("warm_pool, wake_s and sleep_s must be >= 0")
        if self.scrape_interval_s is not None and self.scrape_interval_s <= 0:
            raise ConfigError("scrape_interval_s must be > 0")
        for name in ("intake_s_per_prompt_token", "output_s_per_token"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.gateways < 1:
            raise ConfigError(f"gateways must be at least 1, got {self.gateways}")
        if self.kv_events_delay_s is not None and not self.kv_events_delay_s >= 0:
            raise ConfigError(f"kv_events_delay_s must be >= 0, got {self.kv_events_delay_s}")


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
    """Replica time awake (a GPU held), every replica from its launch (cold start included)
    to its stop or the end of the level, less its time asleep."""
    replica_asleep_s: float = 0.0
    """Replica time asleep in the warm pool (host memory held, no GPU)."""
    wakes: int = 0
    """Sleeping replicas woken."""
    scale_events: int | None = None
    """Decisions that changed the number of replicas; None without an autoscaler."""
    cached_tokens_per_request: float = 0.0
    """Prompt tokens found in the prefix cache per request sent to a replica."""
    kv_exact: bool = False
    """Routing read the exact index kept from the replicas' KV events (else its guess)."""
    engine_queue_s: float | None = None
    """Mean time a measured request waited in its engine's scheduler queue (vLLM's
    request_queue_time_seconds: queued to first scheduled); None with no request answered."""
    engine_prefill_s: float | None = None
    """Mean time from its first scheduled step to its first token (vLLM's
    request_prefill_time_seconds)."""


@dataclass(frozen=True, slots=True)
class LevelOutcome:
    run: Run
    stats: FleetStats


@dataclass(frozen=True, slots=True)
class Progress:
    sim_s: float
    completed: int
    failed: int
