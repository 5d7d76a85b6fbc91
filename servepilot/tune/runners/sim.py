"""The simulated trial runner: one trial is `servepilot sim` of the trial's fleet, in-process.

The fleet a trial would launch (`PlanSpace.fleet`) goes through `servepilot sim`'s own setup
(`sim.fleet.setup.replica_setup`: vLLM's KV blocks, the cost profile or the roofline, the
gateway's budget) and each load level through its `run_level`, so a simulated trial is what
`servepilot sim -c trial.yaml --concurrency N` reports, level by level, in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.errors import ConfigError
from servepilot.core.results import Run
from servepilot.core.slo import Slo
from servepilot.engine.cpu import cpu_flags
from servepilot.load.arrivals import Arrival
from servepilot.load.levels import LevelOptions
from servepilot.load.workload import WorkloadSpec
from servepilot.sim.fleet.network import parse_network
from servepilot.sim.fleet.session import SimOptions, run_level
from servepilot.sim.fleet.setup import fleet_spec, replica_setup
from servepilot.tune.loadsweep import LoadSweep, next_load
from servepilot.tune.planspace import PlanSpace
from servepilot.tune.score import Failure, FailureCause, Measurement, Outcome
from servepilot.tune.space import TrialConfig

_MEMORY_WORDS = ("does not fit", "num_blocks", "memory", "KV cache")


@dataclass(frozen=True, slots=True)
class SimTrialRunner:
    space: PlanSpace
    workload: WorkloadSpec
    sweep: LoadSweep
    sla: Slo
    profile: Path | None
    on_level: Callable[[Run], None]

    def run(self, config: TrialConfig) -> Outcome:
        fleet = self.space.fleet(config)
        try:
            setup = replica_setup(fleet, self.profile, cpu_flags())
            network = parse_network(None, setup.replicas_per_node)
            spec = fleet_spec(fleet, setup, network=network, seed=self.workload.seed)
        except ConfigError as exc:
            return _failure(exc)
        levels = LevelOptions(
            workload=self.workload,
            loads=(),
            sweep=None,
            requests=self.sweep.requests_per_level,
            duration_s=None,
            warmup_requests=0,
            arrival=Arrival.POISSON,
            burstiness=1.0,
        )
        opts = SimOptions(
            spec=spec,
            levels=levels,
            slo=self.sla,
            prompt_overhead_tokens=setup.prompt_overhead_tokens,
            target={},
        )
        runs: list[Run] = []
        preemptions = 0
        while (load := next_load(self.sweep, self.sla, runs).load) is not None:
            outcome = run_level(opts, len(runs), load)
            runs.append(outcome.run)
            preemptions += outcome.stats.preemptions
            self.on_level(outcome.run)
        return Measurement(
            runs=tuple(runs),
            capacity=spec.capacity * spec.replicas,
            preemptions=preemptions,
            kv_capacity_tokens=setup.kv_capacity_tokens,
            startup_s=0.0,
        )


def _failure(exc: ConfigError) -> Failure:
    text = exc.message
    memory = any(word in text for word in _MEMORY_WORDS)
    cause = FailureCause.OUT_OF_MEMORY if memory else FailureCause.DID_NOT_START
    return Failure(cause, text)
