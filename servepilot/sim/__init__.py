"""Simulation: a model of one vLLM v1 engine, and a fleet of them behind the gateway's policies.

- engine/: one replica (scheduler, KV blocks, step times, knobs -> limits). Pure: plain data
  and functions over simulated time, no wall clock, no sockets, no files.
- fleet/: the discrete-event fleet simulator (clients, network, the gateway's own routing and
  admission objects, replicas, the autoscaling hook, metrics as bench computes them). Pure,
  except that simulator.py reads the wall clock to report how fast it ran.

The compiled core: core/accel.py loads a mypyc build of the hot modules (its group `SIM`) when
one matching their sources exists (`make sim-fast` makes it); otherwise everything runs as
Python. fleet/liveview.py stays interpreted.

The simulated vLLM server (`python -m servepilot.engine.simserver.server`) is an engine, not
a simulation: it lives in servepilot/engine/simserver and drives engine/ in wall-clock time.
"""

from servepilot.sim.engine.records import SchedulerConfig, StepResult
from servepilot.sim.engine.replica import ReplicaModel
from servepilot.sim.engine.request import RequestState, SimRequest

__all__ = ["ReplicaModel", "RequestState", "SchedulerConfig", "SimRequest", "StepResult"]
