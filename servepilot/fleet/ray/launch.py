"""`up` on a Ray cluster (`cluster.backend: ray`): the cluster joined (or started), the Ray
backend made (`backend.RayBackend`: the replicas as actors on the cluster's nodes), handed to
`up`'s one serve lifecycle (`fleet.up`), which runs the gateway here, in front of them. While
the fleet serves, `status`'s view of the cluster is rewritten; on the way out the cluster is
left (or, started here, stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from servepilot.core.config import EngineKind, FleetConfig
from servepilot.engine.model_source import local_tokenizer
from servepilot.engine.simserver.args import sim_model
from servepilot.fleet.autoscale.start import initial_replicas
from servepilot.fleet.backend import ReplicaState
from servepilot.fleet.ray import cluster
from servepilot.fleet.ray.backend import RayBackend
from servepilot.fleet.ray.placement import check_room, check_whole_gpus
from servepilot.fleet.ray.replicas import RayReplicas
from servepilot.fleet.ray.view import ClusterView, GroupRow, ReplicaRow, remove_view, write_view
from servepilot.fleet.serve import FleetLaunch, ServedGateway

# How often `status`'s view of the cluster is rewritten.
_VIEW_EVERY_S = 2.0


@contextlib.asynccontextmanager
async def ray_fleet(
    config: FleetConfig,
    step: Callable[[str], None],
    warn: Callable[[str], None],
    run_dir: Path,
) -> AsyncIterator[FleetLaunch]:
    """The Ray backend of `config`'s fleet, ready to start; the cluster is left on exit."""
    check_whole_gpus(config)
    replicas_section = config.replicas.model_copy(update={"count": initial_replicas(config)})
    config = config.model_copy(update={"replicas": replicas_section})
    # On this thread, blocking: ray.init installs its signal handlers on the main thread only
    # (up's replace them once the lifecycle begins), and nothing else runs yet.
    connection = cluster.connect(config.cluster)
    try:
        gw = config.gateway
        replicas = RayReplicas(config, run_dir, f"servepilot-{gw.port}-{os.getpid()}")
        nodes = await asyncio.to_thread(cluster.alive_resources)
        step(f"Ray cluster at {config.cluster.address}: {len(nodes)} node(s) alive")
        if lacking := check_room(replicas.plan, nodes, connection.started_cluster):
            timeout_s = config.cluster.placement_timeout_s
            warn(f"{lacking}; waiting up to {timeout_s:g} s for nodes to join")
        step(f"placing {replicas.plan.describe()}")
        what = "simulated" if config.engine.kind is EngineKind.SIM else "vLLM"
        count = config.replicas.count
        step(f"starting {count} {what} replica(s) as Ray actors; logs in {run_dir}")
        backend = RayBackend(replicas, warn, step)
        yield FleetLaunch(
            backend,
            count,
            lambda: next(iter(replicas.answers.values())).served_name,
            access_log=None,
            stop_line="draining the gateway and removing the replicas' actors and placement groups",
            supervise=functools.partial(_keep_view, config.cluster.address, backend),
            tokenizer=_tokenizer(config),
        )
    finally:
        connection.close()


def _tokenizer(config: FleetConfig) -> str | None:
    """The tokenizer of the replicas' model, for the gateway's exact prefix index, where this
    node (the gateway's) has it; else their prefix caches are guessed."""
    if config.engine.kind is EngineKind.SIM:
        folder = sim_model(config.model, config.engine.sim_tokenizer).tokenizer
        return None if folder is None else str(folder)
    folder = local_tokenizer(config.model)
    return None if folder is None else str(folder)


async def _keep_view(
    address: str, backend: RayBackend, served: ServedGateway, stop: asyncio.Event
) -> None:
    """Rewrite `status`'s view of the cluster until told to stop, then remove it."""
    try:
        while not stop.is_set():
            view = await asyncio.to_thread(_view, address, backend)
            write_view(served.port, view)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _VIEW_EVERY_S)
    finally:
        remove_view(served.port)


def _view(address: str, backend: RayBackend) -> ClusterView:
    replicas, watcher = backend.replicas, backend.watcher
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
