"""`servepilot sim`'s fleet flags, as typed, and the simulation they set up with fleet.yaml.
Each field is its flag's argparse dest (argparse holds the defaults, as --help states them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.config import FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.core.slo import parse_slo
from servepilot.core.units import parse_duration_or_zero_s, parse_duration_s
from servepilot.load.levels import LevelOptions
from servepilot.scaling.policies import AutoscaleSetup
from servepilot.sim.fleet import setup as fleet_setup
from servepilot.sim.fleet.network import parse_network
from servepilot.sim.fleet.records import FleetSpec
from servepilot.sim.fleet.session import SimOptions


@dataclass(frozen=True, slots=True)
class SimFlags:
    profile: Path | None
    replicas_per_node: int | None
    network_ms: str | None
    scrape_interval: str | None
    cold_start: str
    start_cold: bool
    autoscale: str | None
    scaling_policy: str
    autoscale_target: float
    replica_rps: float | None
    forecast_horizon: str | None
    autoscale_interval: str
    slo: str | None
    """--slo; None: fleet.yaml's slo section."""
    seed: int
    warm_pool: int | None = None
    """--warm-pool; None: fleet.yaml's replicas.asleep (of replicas.count)."""
    wake_time: str | None = None
    sleep_time: str | None = None
    pool_refill: str = "cold"
    kv_events: str | None = None
    """--kv-events on/off; None: fleet.yaml's engine.kv_events."""
    kv_events_delay_ms: float | None = None
    gateways: int = 1

    def spec(self, config: FleetConfig, setup: fleet_setup.ReplicaSetup) -> FleetSpec:
        per_node = self.replicas_per_node or setup.replicas_per_node
        if per_node < 1:
            raise ConfigError(f"--replicas-per-node must be at least 1, got {per_node}")
        scrape = self.scrape_interval
        network = parse_network(self.network_ms, per_node, setup.request_overhead_s / 2)
        spec = fleet_setup.fleet_spec(config, setup, network=network, seed=self.seed)
        if self.kv_events is not None:
            spec = dataclasses.replace(spec, kv_events=self.kv_events == "on")
        if self.kv_events_delay_ms is not None:
            spec = dataclasses.replace(spec, kv_events_delay_s=self.kv_events_delay_ms / 1e3)
        if self.gateways < 1:
            raise ConfigError(f"--gateways must be at least 1, got {self.gateways}")
        pool = self.warm_pool
        if pool is None:  # fleet.yaml's: asleep of replicas.count, the rest serve
            pool = config.replicas.asleep
            spec = dataclasses.replace(spec, replicas=max(0, spec.replicas - pool))
        if pool < 0:
            raise ConfigError(f"--warm-pool must be at least 0, got {pool}")
        return dataclasses.replace(
            spec,
            gateways=self.gateways,
            warm_pool=pool,
            cold_refill=self.pool_refill == "cold",
            wake_s=parse_duration_or_zero_s(self.wake_time, "--wake-time")
            if self.wake_time
            else spec.wake_s,
            sleep_s=parse_duration_or_zero_s(self.sleep_time, "--sleep-time")
            if self.sleep_time
            else spec.sleep_s,
            scrape_interval_s=parse_duration_s(scrape, "--scrape-interval") if scrape else None,
            cold_start_s=parse_duration_or_zero_s(self.cold_start, "--cold-start"),
            start_cold=self.start_cold,
            autoscale_interval_s=parse_duration_s(self.autoscale_interval, "--autoscale-interval"),
        )

    def options(
        self, config: FleetConfig, levels: LevelOptions, cpu_flags: frozenset[str]
    ) -> tuple[fleet_setup.ReplicaSetup, SimOptions]:
        """The replicas' setup (what narration describes) and the simulation to run."""
        setup = fleet_setup.replica_setup(config, self.profile, cpu_flags)
        spec = self.spec(config, setup)
        scaling = fleet_setup.autoscaler(self.autoscale, self.scaling_policy,
            self.autoscale_target, self.replica_rps, self.forecast_horizon, spec)  # fmt: skip
        if scaling is None and config.autoscale.enabled:  # fleet.yaml's, as `up` would run it
            section, pool = config.autoscale, spec.warm_pool
            spec = dataclasses.replace(spec, autoscale_interval_s=section.tick_s(pool))
            scaling = AutoscaleSetup.from_section(section, spec.cold_start_s, pool).with_pool(
                pool, spec.wake_s, spec.autoscale_interval_s
            )
        budget = config.autoscale.adaptive_budget
        if budget.enabled and scaling is None:
            raise ConfigError(
                "autoscale.adaptive_budget.enabled: the simulated autoscaler moves the budgets "
                "at each tick, and this run has none",
                hint="add --autoscale N:N (a fixed fleet of N) or enable fleet.yaml's autoscale",
            )
        target = fleet_setup.target_section(config, setup, spec, self.profile, scaling)
        if budget.enabled:
            target["adaptive_budget"] = budget.model_dump(mode="json")
        return setup, SimOptions(
            spec=spec, levels=levels,
            slo=parse_slo(self.slo) if self.slo else config.slo,
            prompt_overhead_tokens=setup.prompt_overhead_tokens,
            target=target, autoscaler=scaling, budget=budget if budget.enabled else None,
        )  # fmt: skip
