"""`up --autoscale`: the controller built from fleet.yaml's `autoscale` section, in front of
one gateway, applying its decisions through the fleet's `ReplicaBackend` (local processes or
Ray actors: `up` passes its own), its metrics on the gateway's /metrics. In a Kubernetes
cluster the gateway runs it (`in_cluster`) on the replicas' Deployment."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from servepilot.core.config import FleetConfig, pool_parks
from servepilot.core.errors import ConfigError
from servepilot.fleet.autoscale.controller import AutoscaleController
from servepilot.fleet.autoscale.decision import Decision
from servepilot.fleet.autoscale.metrics import AutoscaleCollector
from servepilot.fleet.autoscale.view import GatewayView
from servepilot.fleet.backend import ReplicaBackend
from servepilot.fleet.k8s.backend import KubernetesBackend
from servepilot.gateway import Gateway
from servepilot.gateway.serve import Alongside
from servepilot.scaling.adaptive_budget import AdaptiveBudget
from servepilot.scaling.policies import AutoscaleSetup
from servepilot.scaling.snapshot import AutoscalePolicy
from servepilot.scaling.warm_pool import WAKE_S


def check_autoscale(config: FleetConfig) -> None:
    """What `up` cannot scale, refused before anything starts."""
    scaling = config.autoscale
    if scaling.enabled and scaling.min_replicas < 1:
        raise ConfigError(
            "autoscale.min_replicas (--autoscale MIN:MAX): `up` keeps at least 1 replica "
            "(0 is for `servepilot sim`)"
        )
    if scaling.adaptive_budget.enabled and not scaling.enabled:
        raise ConfigError(
            "autoscale.adaptive_budget.enabled needs autoscale.enabled: the autoscaler moves "
            "the budgets at each tick",
            hint="for a fixed fleet: autoscale: {enabled: true, min_replicas: N, max_replicas: N}",
        )


def initial_replicas(config: FleetConfig) -> int:
    """replicas.count, its serving part (without the replicas.asleep of the warm pool) moved
    inside the autoscaling bounds when the fleet autoscales."""
    count, pool = config.replicas.count, config.replicas.asleep
    scaling = config.autoscale
    if not scaling.enabled:
        return count
    return min(scaling.max_replicas, max(scaling.min_replicas, count - pool)) + pool


def fleet_policy(config: FleetConfig, cold_start_s: float, pool_target: int) -> AutoscalePolicy:
    """fleet.yaml's policy as `sim -c` builds it: behind a pool of `pool_target`, it starts
    cold only what the pool cannot wake (in the wake measured on an H200) within a tick, the
    pool's (`autoscale.pool_interval_s`)."""
    scaling = config.autoscale
    setup = AutoscaleSetup.from_section(scaling, cold_start_s, pool_target)
    return setup.with_pool(pool_target, WAKE_S, scaling.tick_s(pool_target)).build()


def start_autoscaler(
    config: FleetConfig,
    gateway: Gateway,
    backend: ReplicaBackend,
    cold_start_s: float,
    on_decision: Callable[[Decision], None] | None = None,
    pool_target: int = 0,
) -> AutoscaleController:
    """The running controller (stop it with `await controller.stop()` before the gateway);
    `pool_target`: its warm pool (replicas.asleep)."""
    scaling = config.autoscale
    controller = AutoscaleController(
        fleet_policy(config, cold_start_s, pool_target),
        backend,
        GatewayView(gateway),
        interval_s=scaling.tick_s(pool_target),
        drain_timeout_s=scaling.drain_timeout_s,
        # The local and Ray backends give up at the startup budget themselves; this catches
        # what they cannot see (a Kubernetes pod that never gets scheduled).
        startup_timeout_s=config.engine.startup_timeout_s + 2 * scaling.interval_s,
        pool_target=pool_target,
        budget=AdaptiveBudget(scaling.adaptive_budget) if scaling.adaptive_budget.enabled else None,
        on_decision=on_decision,
    )
    gateway.metrics.registry.register(AutoscaleCollector(controller))
    controller.start()
    return controller


def cluster_autoscaler(
    config: FleetConfig, source: KubernetesBackend | None, deployment: str | None
) -> Alongside | None:
    """What `gateway --scale-deployment NAME` runs beside the gateway (None without the
    flag); refused unless the gateway discovers its pods and fleet.yaml autoscales."""
    if deployment is None:
        return None
    if source is None:
        raise ConfigError("--scale-deployment: the gateway finds the pods with --discover k8s:SVC")
    if not config.autoscale.enabled:
        raise ConfigError(
            "--scale-deployment: fleet.yaml's autoscale section is not enabled (--config)",
            hint="autoscale: {enabled: true, policy: step, min_replicas: 2, max_replicas: 20}",
        )
    return lambda gateway: in_cluster(config, gateway, source)


@contextlib.asynccontextmanager
async def in_cluster(
    config: FleetConfig, gateway: Gateway, backend: KubernetesBackend
) -> AsyncIterator[AutoscaleController]:
    """The controller of `gateway --discover k8s:SVC --scale-deployment NAME`, scaling that
    Deployment (`backend.scaling`); pods it already asks for count as starting. Entered once
    the backend's watch has synced. Its cold start (predictive's horizon, where
    autoscale.forecast_horizon_s is unset) is engine.startup_timeout_s, the startup probe's
    budget: no pod has been timed here. Its warm pool (replicas.asleep) sleeps and wakes the
    pods through the gateway as `up`'s does (parked where they have no sleep mode); pods
    found asleep (put to sleep by a gateway before this one) join the pool, not rotation."""
    if backend.scaling is None:
        raise ConfigError("the autoscaler in a cluster needs --scale-deployment NAME")
    await backend.scaling.prime()
    gateway.warm.parks = pool_parks(config)
    if backend.sleep_mode:
        # One that left meanwhile is the membership's to drop: its error is no matter.
        asked = [gateway.warm.recognise(r.replica_id) for r in gateway.pool.replicas()]
        await asyncio.gather(*asked, return_exceptions=True)
    controller = start_autoscaler(config, gateway, backend, config.engine.startup_timeout_s,
                                  pool_target=config.replicas.asleep)  # fmt: skip
    try:
        yield controller
    finally:
        await controller.stop()
