"""Simulation: a model of one vLLM v1 engine (scheduler, KV blocks, step times) that the
fleet simulator and the simulated HTTP replica drive. Pure: no clocks, no I/O."""

from servepilot.sim.records import SchedulerConfig, StepResult
from servepilot.sim.replica import ReplicaModel
from servepilot.sim.request import RequestState, SimRequest

__all__ = ["ReplicaModel", "RequestState", "SchedulerConfig", "SimRequest", "StepResult"]
