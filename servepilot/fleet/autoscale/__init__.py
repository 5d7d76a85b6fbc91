"""The autoscaler controller: every tick it reads the gateway's live state into a
`scaling.FleetSnapshot` (`view`), asks a policy of `scaling/`, and applies the answer through
a `ScalingBackend` (`backend`: the seam; `local` starts and stops replica processes,
`fleet.ray.scaling` replica actors), draining a replica at the gateway before its backend
stops it (`controller`). Its decisions are logged and exported on the gateway's /metrics
(`metrics`); `start` wires it into `up`, which passes its backend."""
