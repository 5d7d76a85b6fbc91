"""Kubernetes as a `ReplicaBackend`: the replicas are the ready endpoints of a Service (its
EndpointSlices, `endpoints`), started and stopped through their Deployment's scale subresource
(`scaling`, when the gateway is given `--scale-deployment`).

The watch is discovery: every `interval_s` it lists the endpoints; a ready one not seen before
is `Joined`, one that turned not ready (a pod terminating: its preStop drain) or disappeared
is `Left`, drained for up to `drain_timeout_s`. A failed listing changes nothing: a blip of
the API server must not empty the gateway. The gateway that runs in the cluster feeds this
watch into its membership (`servepilot gateway --discover k8s:SVC`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from servepilot.core.errors import ConfigError
from servepilot.engine.args import KvEventsPorts
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.backend import Joined, Left, Replica, ReplicaEvent, ReplicaState, Synced
from servepilot.fleet.k8s.endpoints import (
    DiscoveryError,
    Endpoint,
    EndpointSource,
    KubernetesEndpoints,
    parse_target,
)
from servepilot.fleet.k8s.scaling import KubernetesScaling

log = logging.getLogger(__name__)

DISCOVERY_INTERVAL_S = 2.0


class KubernetesBackend:
    """The replicas `source` lists; `scaling` (None: discovery only, nothing to start or
    stop) moves their Deployment."""

    def __init__(
        self,
        source: EndpointSource,
        scaling: Callable[[KubernetesBackend], KubernetesScaling] | None = None,
        *,
        interval_s: float = DISCOVERY_INTERVAL_S,
        drain_timeout_s: float = 30.0,
        sleep_mode: bool = False,
    ) -> None:
        """`scaling(self)`: the Deployment's scaler, given this backend (whose ready replicas
        tell it which pending pods have joined); `sleep_mode`: the pods run vLLM's sleep mode
        (`k8s render` turns it on for a warm pool on GPUs)."""
        self.source = source
        self._sleep_mode = sleep_mode
        self._interval_s = interval_s
        self._drain_timeout_s = drain_timeout_s
        self._ready: dict[str, Endpoint] = {}
        """The ready endpoints at the last listing, by replica id."""
        self.scaling = scaling(self) if scaling is not None else None

    @classmethod
    def discover(
        cls,
        target: str,
        deployment: str | None = None,
        drain_timeout_s: float = 30.0,
        sleep_mode: bool = False,
    ) -> KubernetesBackend:
        """`k8s:SERVICE[.NAMESPACE]` from inside a pod, scaling `deployment` if given."""
        service, namespace = parse_target(target)
        endpoints = KubernetesEndpoints(service, namespace)
        scaling = None
        if deployment is not None:

            def scaling(backend: KubernetesBackend) -> KubernetesScaling:
                return KubernetesScaling(endpoints.api, deployment, endpoints, backend.ready_ids)

        return cls(endpoints, scaling, drain_timeout_s=drain_timeout_s, sleep_mode=sleep_mode)

    def ready_ids(self) -> frozenset[str]:
        return frozenset(self._ready)

    @property
    def sleep_mode(self) -> bool:
        """The gateway's warm pool sleeps and wakes the pods over HTTP, as it does local ones."""
        return self._sleep_mode

    def _scaler(self) -> KubernetesScaling:
        if self.scaling is None:
            raise ConfigError("this gateway scales no Deployment (--scale-deployment NAME)")
        return self.scaling

    async def start(self, count: int = 1) -> tuple[str, ...]:
        scaler = self._scaler()
        return tuple([await scaler.add() for _ in range(count)])

    async def wait_started(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        return []  # the Deployment's pods were started by `kubectl apply`, not by us

    async def stop(self, replica_id: str) -> None:
        await self._scaler().remove(replica_id)

    async def stop_all(self) -> None:
        """Nothing: the Deployment's pods outlive the gateway."""

    async def close(self) -> None:
        if self.scaling is not None:
            await self.scaling.close()

    def list(self) -> tuple[Replica, ...]:
        scaling = self.scaling
        starting = scaling.starting() if scaling is not None else ()
        ready = tuple(Replica(rid, e.url, ReplicaState.READY, where=e.pod or "",
                              launched_as=scaling.launched_as(rid) if scaling else "")
                      for rid, e in self._ready.items())  # fmt: skip
        return ready + tuple(Replica(rid, "", ReplicaState.STARTING) for rid in starting)

    async def watch(self) -> AsyncIterator[ReplicaEvent]:
        self._ready = {}  # a new watch starts from nothing: the first listing joins them all
        for event in await self.poll():
            yield event
        yield Synced()
        while True:
            await asyncio.sleep(self._interval_s)
            for event in await self.poll():
                yield event

    async def poll(self) -> tuple[ReplicaEvent, ...]:
        """One listing, as the changes since the last."""
        try:
            endpoints = await self.source.list_endpoints()
        except DiscoveryError as exc:
            log.warning("discovery: %s; the replicas stay as they were", exc)
            return ()
        ready = {e.replica_id: e for e in endpoints if e.ready}
        left = tuple(
            Left(rid, self._drain_timeout_s, "its endpoint is gone or not ready")
            for rid in sorted(self._ready.keys() - ready.keys())
        )
        # Rendered pods publish on vLLM's default ports (engine.args.serve_argv); a pod that
        # publishes nothing is found out by the gateway, which then guesses its prefixes.
        events = KvEventsPorts()
        joined = tuple(Joined(rid, e.url, kv_events=events) for rid, e in sorted(ready.items())
                       if rid not in self._ready)  # fmt: skip
        self._ready = ready
        return left + joined
