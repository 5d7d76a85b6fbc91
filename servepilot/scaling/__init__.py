"""Pure autoscaling policies: a fleet snapshot and the time in, a replica count out. No I/O:
the fleet simulator and the fleet's controller feed them the same snapshots."""
