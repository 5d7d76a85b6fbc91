"""The Ray backend of `up` (`cluster.backend: ray`; `backend.RayBackend`, made by `launch`):
replicas as Ray actors in placement groups, spread across the cluster's nodes (placement.py
says how); the gateway runs where `up` runs and learns the replicas through the backend's
watch as Ray places, loses and restarts them, and as the autoscaler adds and removes them
(scaling.py). Nothing here imports `fleet.up` (an import-linter contract).

Only this package imports `ray` (an import-linter contract), and only its modules that talk
to a cluster: `placement` is pure planning, importable without Ray installed.
"""
