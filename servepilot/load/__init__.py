"""What a load test sends and when: arrivals, load plans, traces, workloads and the sweep
rule. One copy of the load semantics, shared by bench (real clients) and sim (simulated ones)."""
