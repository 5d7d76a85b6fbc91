"""The autoscaler controller: every tick it reads the gateway's live state into a
`scaling.FleetSnapshot` (`view`), asks a policy of `scaling/`, and applies the answer through
a `ScalingBackend` (`backend`: the seam; `local` starts and stops replica processes,
`fleet.ray.scaling` replica actors, `fleet.k8s.scaling` a Deployment's pods), draining a
replica at the gateway before its backend stops it (`controller`). Its decisions are logged
and exported on the gateway's /metrics (`metrics`); `start` wires it into `up`, which passes
its backend, and into the gateway in a Kubernetes cluster (`in_cluster`)."""
