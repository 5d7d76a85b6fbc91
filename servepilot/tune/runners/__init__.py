"""Trial runners of the search: a trial on real vLLM replicas (vllm.py) or simulated (sim.py)."""
