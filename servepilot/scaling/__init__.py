"""Pure autoscaling policies: a fleet snapshot and the time in, a replica count and its reason
out (`snapshot.py`). Utilisation is defined once (`utilisation.py`); `step` holds the seeds'
rules, `predictive` a forecast (`forecast.py`) ahead of the cold start plus a headroom from its
own errors (`headroom.py`), `target_utilisation` the HPA-like baseline; `policies` builds one
by name. No I/O: the fleet simulator and the fleet's controller feed them the same snapshots."""
