"""The simulated vLLM server: vLLM's HTTP API, flags and metric names, answered in wall-clock
time by the replica model of servepilot/sim/engine (`engine.kind: sim`).

The one arrow outside DESIGN.md's engine -> http1, plan: this package drives
servepilot.sim.engine, the model it serves (pyproject.toml's import-linter contracts name it).
"""
