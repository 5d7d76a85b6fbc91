"""The Ray backend of `up` (`cluster.backend: ray`): replicas as Ray actors in placement groups,
spread across the cluster's nodes (placement.py says how); the gateway runs where `up` runs
and learns the replicas as Ray places, loses and restarts them, and as the autoscaler adds
and removes them (scaling.py).

Only this package imports `ray` (an import-linter contract), and only its modules that talk
to a cluster: `placement` is pure planning, importable without Ray installed.
"""
