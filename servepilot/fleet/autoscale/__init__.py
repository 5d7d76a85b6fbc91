"""The autoscaler controller: every tick it reads the gateway's live state into a
`scaling.FleetSnapshot` (`view`), asks a policy of `scaling/`, and applies the answer through
the fleet's `ReplicaBackend` (`fleet.backend`: local processes, Ray actors, a Deployment's
pods), draining a replica at the gateway before its backend stops it (`controller`). The
replicas it adds join the gateway through the backend's watch, as the first ones do. Its
decisions are logged and exported on the gateway's /metrics (`metrics`); `start` wires it into
`up`, which passes its backend, and into the gateway in a Kubernetes cluster (`in_cluster`)."""
