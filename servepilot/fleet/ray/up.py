"""`up` on a Ray cluster (`cluster.backend: ray`): the replicas as actors on the cluster's
nodes, the gateway here, in front of them, following them as they come and go.

Order of start: the cluster joined (or started) -> fleet record (`starting`) -> placement groups
placed -> actors started -> servers ready -> gateway -> watcher -> fleet record (`serving`) ->
with `autoscale.enabled`, the autoscaler (`scaling.py`: its replicas join through the watcher).
Order of stop, the reverse: autoscaler -> record -> watcher -> gateway (drain) -> actors and
groups removed -> the cluster left (or, started here, stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from servepilot.core.config import EngineKind, FleetConfig
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.autoscale.controller import AutoscaleController
from servepilot.fleet.autoscale.start import initial_replicas, start_autoscaler
from servepilot.fleet.logs import gateway_log, new_run_dir, replica_log_name
from servepilot.fleet.ray import cluster
from servepilot.fleet.ray.actor import ActorReady
from servepilot.fleet.ray.placement import check_room, check_whole_gpus
from servepilot.fleet.ray.replicas import RayReplicas
from servepilot.fleet.ray.scaling import RayScaling
from servepilot.fleet.ray.view import ClusterView, GroupRow, ReplicaRow, remove_view, write_view
from servepilot.fleet.ray.watcher import GatewayMembership, ReplicaState, ReplicaWatcher
from servepilot.fleet.serve import (
    ServedGateway,
    Upstream,
    check_port_free,
    fleet_facts,
    start_gateway,
)
from servepilot.fleet.state import (
    ReplicaRecord,
    check_no_fleet,
    remove_record,
)
from servepilot.fleet.up import (
    DRAIN_TIMEOUT_S,
    ServingRecord,
    StartingRecord,
    UpReporter,
    UpStarted,
    stop_event,
    until_stopped,
)
from servepilot.plan.request import fleet_vllm_defaults
from servepilot.routing.admission.budget import replica_capacity

# How often `status`'s view of the cluster is rewritten.
_VIEW_EVERY_S = 2.0


async def run_ray_up(
    config: FleetConfig, report: UpReporter, detached_run_dir: Path | None = None
) -> None:
    """Serve on the Ray cluster until SIGINT or SIGTERM, then drain and remove everything.
    `detached_run_dir`: as run_up's (this is the process `up --detach` started)."""
    check_whole_gpus(config)
    gw = config.gateway
    check_port_free(gw.host, gw.port)
    check_no_fleet(gw.port)
    replicas = config.replicas.model_copy(update={"count": initial_replicas(config)})
    config = config.model_copy(update={"replicas": replicas})
    # On this thread, blocking: ray.init installs its signal handlers on the main thread only
    # (ours replace them once the replicas start), and nothing else runs yet.
    connection = cluster.connect(config.cluster)
    try:
        await _run(config, report, connection.started_cluster, detached_run_dir)
    finally:
        remove_view(gw.port)
        connection.close()


async def _run(
    config: FleetConfig, report: UpReporter, fixed_cluster: bool, detached_run_dir: Path | None
) -> None:
    gw = config.gateway
    run_dir = detached_run_dir or new_run_dir()
    replicas = RayReplicas(config, run_dir, f"servepilot-{gw.port}-{os.getpid()}")
    stop = stop_event()
    nodes = await asyncio.to_thread(cluster.alive_resources)
    report.step(f"Ray cluster at {config.cluster.address}: {len(nodes)} node(s) alive")
    if lacking := check_room(replicas.plan, nodes, fixed_cluster):
        timeout_s = config.cluster.placement_timeout_s
        report.warn(f"{lacking}; waiting up to {timeout_s:g} s for nodes to join")
    report.step(f"placing {replicas.plan.describe()}")
    what = "simulated" if config.engine.kind is EngineKind.SIM else "vLLM"
    report.step(
        f"starting {config.replicas.count} {what} replica(s) as Ray actors; logs in {run_dir}"
    )
    # pid 0 and no URL yet: the servers will run on the cluster's nodes, at ports not chosen.
    awaited = [ReplicaRecord(i, "", 0, str(run_dir / replica_log_name(i)), ready=False)
               for i in replicas.replica_ids]  # fmt: skip
    starting = StartingRecord(f"http://{gw.host}:{gw.port}", gw.port, run_dir, awaited)
    try:
        infos = await until_stopped(replicas.start(starting.ready(report)), stop)
        if infos is not None:
            with gateway_log(run_dir):
                detached = detached_run_dir is not None
                await _serve(config, replicas, infos, stop, report, detached)
    finally:
        remove_record(gw.port)


async def _serve(
    config: FleetConfig,
    replicas: RayReplicas,
    infos: list[ReplicaInfo],
    stop: asyncio.Event,
    report: UpReporter,
    detached: bool,
) -> None:
    served: ServedGateway | None = None
    watcher: ReplicaWatcher | None = None
    autoscaler: AutoscaleController | None = None
    try:
        upstreams = [Upstream(i.replica_id, i.url, _capacity(config, i)) for i in infos]
        served = await start_gateway(config.gateway, upstreams, facts=fleet_facts(config))
        if served.port != config.gateway.port:  # port 0: the OS picked one
            remove_record(config.gateway.port)
        membership = GatewayMembership(served.gateway, lambda a: _answer_capacity(config, a))
        # `following`: the same watcher, never None, for the closures below.
        watcher = following = ReplicaWatcher(
            replicas.replicas, membership, report.warn, report.step
        )
        following.start(replicas.answers)
        model_name = next(iter(replicas.answers.values())).served_name
        report.serving(UpStarted(served.url, model_name, tuple(infos), detached))
        record = ServingRecord(served, run_dir=replicas.run_dir,
                               rows=lambda: _rows(following.answers), config=config)  # fmt: skip
        record.write()
        if config.autoscale.enabled:
            backend = RayScaling(replicas, following, report.warn)
            cold_start_s = max(i.startup_s for i in infos)
            autoscaler = start_autoscaler(config, served.gateway, backend, cold_start_s,
                                          record.on_decision(report))  # fmt: skip
        while not stop.is_set():
            view = await asyncio.to_thread(_view, config.cluster.address, replicas, watcher)
            write_view(served.port, view)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _VIEW_EVERY_S)
    finally:
        if autoscaler is not None:
            await autoscaler.stop()  # first: nothing is added, removed or recorded after
        if served is not None:
            remove_record(served.port)
            remove_view(served.port)
        report.step("draining the gateway and removing the replicas' actors and placement groups")
        if watcher is not None:
            await watcher.stop()
        if served is not None:
            await served.stop(DRAIN_TIMEOUT_S)
        await replicas.stop()


def _rows(answers: Mapping[str, ActorReady]) -> tuple[ReplicaRecord, ...]:
    # pid 0: the servers run on the cluster's nodes, not here; `down` stops them through
    # this `up` (and Ray stops them if it dies), never by pid.
    infos = [a.info for a in list(answers.values()) if a.info is not None]
    return tuple(ReplicaRecord(i.replica_id, i.url, 0, str(i.log_path)) for i in infos)


def _capacity(config: FleetConfig, info: ReplicaInfo) -> int:
    kv = info.kv.kv_capacity_tokens if info.kv else None
    return replica_capacity(config, fleet_vllm_defaults(config), kv)


def _answer_capacity(config: FleetConfig, answer: ActorReady) -> int | None:
    return _capacity(config, answer.info) if answer.info else None


def _view(address: str, replicas: RayReplicas, watcher: ReplicaWatcher) -> ClusterView:
    groups = [GroupRow(g.name, g.state, g.node_ids) for g in replicas.group_states()]
    rows = []
    for replica in list(replicas.replicas):  # the autoscaler may add or remove one meanwhile
        rid = replica.replica_id
        answer = watcher.answers.get(rid)
        url = answer.info.url if answer and answer.info else ""
        state = watcher.states.get(rid, ReplicaState.STARTING)
        rows.append(ReplicaRow(rid, state, answer.node_id if answer else "", url,
                               watcher.restarts.get(rid, 0)))  # fmt: skip
    return ClusterView(address, tuple(cluster.nodes()), tuple(groups), tuple(rows))
