"""What the fleet simulator's tests share: a small fleet with the engine tests' cost model and
no network, its load plans, and one request's step times alone on a replica, from which the
tests write their answers down."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from servepilot.core.config import GatewayConfig, PolicyName
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.load.loadplan import LoadPlan
from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec, LevelOutcome
from servepilot.sim.fleet.traffic import Job, JobTable
from tests.unit.sim_replica_support import COST

NO_NETWORK = NetworkConfig(cross_node=Delay())


def scheduler_config(**changes: Any) -> SchedulerConfig:
    fields: dict[str, Any] = dict(
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        max_model_len=2048,
        block_size=16,
        num_blocks=4000,
    )
    return SchedulerConfig(**(fields | changes))


def fleet_spec(replicas: int = 1, *, policy: str = "round_robin", **changes: Any) -> FleetSpec:
    gateway = changes.pop("gateway", GatewayConfig(policy=PolicyName(policy)))
    fields: dict[str, Any] = dict(
        scheduler=changes.pop("scheduler", scheduler_config()),
        cost=COST,
        replicas=replicas,
        capacity=64,
        gateway=gateway,
        network=NO_NETWORK,
    )
    return FleetSpec(**(fields | changes))


def rate_plan(value: float, requests: int) -> LoadPlan:
    return LoadPlan(Load(mode=LoadMode.RATE, value=value), max_requests=requests)


def closed_plan(value: int, requests: int) -> LoadPlan:
    return LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=value), max_requests=requests)


def run_open(
    spec: FleetSpec, jobs: list[Job], offsets: Iterator[float], requests: int, **kw: Any
) -> tuple[FleetSim, LevelOutcome]:
    sim = FleetSim(spec, **kw)
    out = sim.run(rate_plan(1.0, requests), JobTable(jobs), Slo(), offsets=offsets)
    return sim, out


def alone_steps(prompt: int, output: int) -> list[float]:
    """Step times of one request alone on one replica, from time 0."""
    model = ReplicaModel(scheduler_config(), COST)
    model.add(SimRequest(0, prompt, output, 0.0))
    now, durations = 0.0, []
    while (result := model.step(now)) is not None:
        durations.append(result.duration_s)
        now = result.end_s
    return durations
