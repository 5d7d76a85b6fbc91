"""One vLLM v1 engine, simulated: vLLM's scheduling loop over aggregates, its KV block pool
with prefix caching, and step times from the cost model (plan/costmodel.py)."""
