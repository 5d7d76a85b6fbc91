"""Simulation: a model of one vLLM v1 engine (scheduler, KV blocks, step times) that the
fleet simulator and the simulated HTTP replica drive.

Pure (plain data and functions over simulated time: no wall clock, no sockets, no files):
- the replica model: replica, scheduler, kvblocks, request, records, steps, engine_setup
  (knobs -> scheduler limits and KV blocks);
- the fleet simulator: fleet, fleet_records, members, gateway, requests, network, traffic,
  collect, autoscale. fleet.py reads the wall clock only to report how fast it ran;
- prefixmap: the simulated replica's map from prompt token ids to prefix groups.

The compiled core: accel loads a mypyc build of the hot modules when one matching their
sources exists (accel_build makes it: `make sim-fast`); otherwise everything runs as Python.
liveview (the fleet's live progress) stays interpreted.

I/O edges (the simulated replica, `python -m servepilot.sim.server`): server (process,
signals), server_http (sockets), server_app (routes), realtime (steps the model in wall-clock
time), server_config (flags; reads the model's config, catalog and cost profile),
server_metrics (/metrics; reads /proc), tokens (reads tokenizer files), openai_api (request
checks and response bytes; stamps responses with the wall clock).
"""

from servepilot.sim.records import SchedulerConfig, StepResult
from servepilot.sim.replica import ReplicaModel
from servepilot.sim.request import RequestState, SimRequest

__all__ = ["ReplicaModel", "RequestState", "SchedulerConfig", "SimRequest", "StepResult"]
