"""The simulated vLLM server: vLLM's HTTP API, flags and metric names, answered in wall-clock
time by the replica model of servepilot/sim/engine (`engine.kind: sim`).

The arrows outside DESIGN.md's engine -> http1, plan (pyproject.toml's import-linter contracts
name them): this package drives servepilot.sim.engine, the model it serves, and hashes its KV
blocks with servepilot.routing.kv_index, the gateway's own keying, so the KV events it
publishes name the blocks the gateway looks up.
"""
