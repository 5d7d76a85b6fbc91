"""fleet.yaml's `cluster` section: where `up` runs the replicas (this machine, or a Ray cluster)
and how a Ray cluster places them.

The defaults keep today's behaviour (local child processes); `backend: ray` with
`address: local` starts a one-node Ray cluster on this machine, so the Ray path can be tried
without one.
"""

from __future__ import annotations

import enum
import re

from pydantic import Field, field_validator

from servepilot.core.config.section import Section as _Section

# `ray://host:port` (Ray Client) or `host:port` (the GCS address `ray start --head` prints).
_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9_.-]+:\d{1,5}")


class ClusterBackend(enum.StrEnum):
    LOCAL = "local"
    """Child processes of `servepilot up` on this machine."""
    RAY = "ray"
    """Ray actors in placement groups, on the nodes of a Ray cluster."""


class Placement(enum.StrEnum):
    SPREAD = "spread"
    """At most one replica per node (the seeds' STRICT_SPREAD): a lost node costs one replica."""
    PACK = "pack"
    """Replicas share nodes where they fit: fewer nodes, a lost node may cost several."""


class ClusterConfig(_Section):
    backend: ClusterBackend = ClusterBackend.LOCAL
    """`local`: the replicas are child processes of `up` on this machine; `ray`: Ray actors on
    the nodes of a Ray cluster (the gateway still runs where `up` runs)."""

    address: str = "auto"
    """backend ray: `auto` joins the cluster this machine belongs to (RAY_ADDRESS or the one
    `ray start` started), `local` starts a Ray cluster of this machine alone for the fleet's
    lifetime, `ray://host:port` connects through Ray Client, `host:port` to a head's GCS."""

    placement: Placement = Placement.SPREAD
    """backend ray: `spread` puts at most one replica per node (STRICT_SPREAD between
    replicas), `pack` lets replicas share nodes. Within one replica the bundles always pack."""

    placement_timeout_s: float = Field(default=120.0, gt=0)
    """backend ray: how long the replicas' placement groups may wait for room; past it `up`
    fails and says what is missing (Ray itself would wait forever)."""

    cpus_per_replica: float = Field(default=1.0, gt=0)
    """backend ray: CPUs the replica's own bundle reserves (its server's process)."""

    max_restarts: int = Field(default=-1, ge=-1)
    """backend ray: how often Ray restarts a replica whose actor or node dies; -1: always."""

    local_cpus: int | None = Field(default=None, ge=1)
    """address local: CPUs the Ray cluster of this machine offers. None: this machine's."""

    @field_validator("address")
    @classmethod
    def _address_form(cls, value: str) -> str:
        if value in ("auto", "local") or _ADDRESS.fullmatch(value):
            return value
        raise ValueError("must be `auto`, `local`, `ray://host:port` or `host:port`")
