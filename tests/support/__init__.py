"""What the tests share with the benchmarks: the zero-cost streaming stub (stub_server.py), a
local multi-node Ray cluster (ray_cluster.py) and the node lost under load on it
(ray_node_loss.py). Benchmarks import these from here; no test imports `benchmarks`."""
