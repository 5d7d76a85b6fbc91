"""What a load test sends and when: one copy of the load semantics, shared by bench (real
clients) and sim (simulated ones).

- workload: what to send (the workload kinds and their flags); shapes: its seeded layout as
  token counts (bench fills it with prompt text, sim takes it as it is); trace: replay files.
- agentic: the agentic workload's flags; sessions: its sessions' scripts and the scheduler of
  their turns, each due a wait after the answer before it (bench and sim alike).
- arrivals: the open loop's seeded send times; loadplan: one load level; slots: which request
  goes when; levels: a run's levels and their sizes; sweep: the next level and the sweet spot.

The simulator's compiled core (core/accel.py) calls into slots and loadplan, so its build key
covers this package; nothing here is compiled: bench imports it without the simulator.
"""
