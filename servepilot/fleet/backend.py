"""The one seam between servepilot and whatever runs replicas: `ReplicaBackend`.

Three implementations: local processes (`fleet.local.LocalBackend`), Ray actors
(`fleet.ray.backend.RayBackend`), a Kubernetes Deployment's pods (`fleet.k8s.backend.
KubernetesBackend`). `up`'s serve lifecycle (`fleet.lifecycle`) and the autoscaler controller
(`fleet.autoscale`) talk only to this protocol; the gateway learns members only through a
backend's `watch`, fed into its membership (`fleet.membership`).

A watch is a list-then-watch stream, as Kubernetes' informers are: first a `Joined` for every
replica serving now, then `Synced`, then each change as it happens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from servepilot.engine.args import KvEventsPorts
from servepilot.engine.process import ReplicaInfo


class ReplicaState(StrEnum):
    STARTING = "starting"
    """Launched, not serving yet (loading, waiting for its GPU's turn, or a pod not ready)."""
    READY = "ready"
    """Serving: in the gateway."""
    LOST = "lost"
    """Its process, actor or pod went without being asked to (Ray may restart it)."""
    FAILED = "failed"
    """Its server did not start."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica as its backend knows it."""

    replica_id: str
    url: str
    """Its server's base URL; empty while the backend does not know it (Ray: not placed yet)."""
    state: ReplicaState
    pid: int = 0
    """Its server's process id on this host; 0 when it runs elsewhere (Ray, Kubernetes)."""
    log_path: str = ""
    where: str = ""
    """The node or pod it runs on, where the backend knows it."""
    remove_first: bool = False
    """Give it back before the others when the fleet shrinks (Ray: an added replica that had
    to share a node with another under `spread`)."""
    launched_as: str = ""
    """The id `start` gave it, where it serves under another (Kubernetes: a pod asked for is
    `pending-N` until one joins); empty: its own."""


@dataclass(frozen=True, slots=True)
class Joined:
    """The replica serves at `url`: the gateway adds it (with its concurrency budget)."""

    replica_id: str
    url: str
    capacity: int | None = None
    """Requests in flight at most (None: the gateway's default)."""
    kv_events: KvEventsPorts | None = None
    """Where on the replica's host its KV events are published (None: nowhere)."""


@dataclass(frozen=True, slots=True)
class Left:
    """The replica goes (scaled down, a pod terminating, an actor lost): the gateway stops
    routing to it, lets its requests finish for up to `drain_timeout_s`, then drops it."""

    replica_id: str
    drain_timeout_s: float
    why: str = ""


@dataclass(frozen=True, slots=True)
class Lost:
    """The replica's process exited: the gateway marks it down at once (no health check
    rounds to wait for), and keeps it listed, down, as `status` shows."""

    replica_id: str
    why: str
    log_path: str = ""


@dataclass(frozen=True, slots=True)
class Synced:
    """Every replica serving when the watch began has had its `Joined`."""


ReplicaEvent = Joined | Left | Lost | Synced


class ReplicaBackend(Protocol):
    """Starts, stops, lists and watches one fleet's replicas.

    `start(count)` launches replicas without waiting for them: the first call starts the
    fleet (Ray places its groups together), later ones add to it (the autoscaler). A replica
    joins the gateway through `watch` once it serves. `stop(replica_id)` stops one the
    gateway has drained (or one still starting); `stop_all` stops them all (the last step of
    an ordered shutdown).

    Sleep and wake: `sleep_mode` says whether the engine this backend runs has vLLM's sleep
    mode. Where it does, the gateway's warm pool (`gateway.warm`) puts its replicas to sleep
    and wakes them, draining a replica first; where it does not, nothing asks.
    """

    @property
    def sleep_mode(self) -> bool: ...

    async def start(self, count: int = 1) -> tuple[str, ...]:
        """Launch `count` replicas without waiting for them to load; their ids."""
        ...

    async def wait_started(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        """Until every replica of the first `start` serves (`on_ready` hears each); a
        FleetError or EngineStartError if one does not, after stopping them all."""
        ...

    async def stop(self, replica_id: str) -> None:
        """Stop one replica: one the gateway has drained, or one still starting."""
        ...

    async def stop_all(self) -> None: ...

    def list(self) -> tuple[Replica, ...]:
        """Every replica launched and not stopped on its own (`stop`), oldest first."""
        ...

    def watch(self) -> AsyncIterator[ReplicaEvent]:
        """The membership as events: a `Joined` per serving replica, `Synced`, then changes."""
        ...

    async def close(self) -> None:
        """Stop waiting for replicas still starting (the autoscaler's, at its stop)."""
        ...


def starting_ids(backend: ReplicaBackend) -> tuple[str, ...]:
    """The replicas launched and not serving yet, oldest first."""
    return tuple(r.replica_id for r in backend.list() if r.state is ReplicaState.STARTING)


def remove_first_ids(backend: ReplicaBackend) -> frozenset[str]:
    return frozenset(r.replica_id for r in backend.list() if r.remove_first)
