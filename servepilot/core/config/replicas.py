"""fleet.yaml's `replicas` section: how many replicas `up` starts, where, and how many sleep."""

from __future__ import annotations

from pydantic import Field

from servepilot.core.config.section import Section as _Section


class ReplicasConfig(_Section):
    count: int = Field(default=1, ge=1)
    """Number of vLLM replicas `servepilot up` starts."""

    host: str = "127.0.0.1"
    """Address the replicas listen on."""

    asleep: int = Field(default=0, ge=0)
    """How many of the `count` replicas `up` puts to sleep once all are ready: a warm pool
    that holds the model in host memory and serves nothing until woken (`servepilot wake
    r1`, about a second on a GPU). Below `count`, so at least one serves; needs
    engine.sleep_mode: true, except on hardware.device: cpu, where vLLM has no sleep mode and
    the pool's replicas are *parked* instead (loaded and running, holding all their memory,
    out of rotation; back in rotation at once). With autoscale.enabled it is the pool the
    autoscaler keeps: it wakes (or un-parks) pool replicas before it starts any cold, puts
    replicas to sleep into the pool before it stops any, and refills the pool behind a
    wake (a cold start, then to sleep); autoscale.min_replicas/max_replicas bound the
    replicas serving, the pool comes on top."""
